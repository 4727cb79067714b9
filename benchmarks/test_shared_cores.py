"""benchmarks/shared_cores.py runs (tiny, untimed): its cases cannot rot between measurements."""
import shared_cores


def test_two_jobs_and_a_busy_loop_each_report_their_steps():
    two = shared_cores.run_case("auto", "second job", [20, 8, 4], 4, 0.3, warmup=3.0)
    spun = shared_cores.run_case("1", "busy loop", [20, 8, 4], 4, 0.3, warmup=3.0)
    assert len(two) == 2 and len(spun) == 1
    assert all(job["steps"] > 0 and job["median"] > 0 for job in two + spun)
    assert spun[0]["threads_at_end"] == 1                 # a fixed count stays fixed
    assert shared_cores.cases(2, False)[:3] == [("auto", "alone"), ("auto", "second job"), ("auto", "busy loop")]
