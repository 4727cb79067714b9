"""One MPI job for test_pipeline_mpi.py: ``mpiexec -n P python pipeline_job.py JSON``.

JSON is a list of cases; each builds a PipelineTrainer after ``np.random.seed(0)``,
runs ``updates`` updates of a mini-batch of ``batch`` MNIST rows per replica and rank 0 writes the
gathered weights and biases (and those before training) to ``out``.  With
``memray`` each rank measures its peak over building and training, after a
warm-up, and rank 0 writes every rank's peak and prediction to ``out``.
"""
import hashlib
import json
import sys

import numpy as np

import fastckpt
from fastckpt.parallel import PipelineTrainer
from fastckpt.report.measure import memray_peak


def run(case, x, y, gather=True):
    kw = {k: case[k] for k in ("schedule", "strategy", "loss", "l2", "partition", "transport", "dtype", "activation",
                               "init", "optimizer", "data_parallel", "optimizer_in_backward", "tensor_parallel")
          if k in case}
    batch, micro = case.get("batch", 20), case.get("micro", 2)
    np.random.seed(0)
    trainer = PipelineTrainer(case["sizes"], micro, batch_size=batch, **kw)
    before = trainer.gather() if gather else None           # the whole net: not part of a stage's peak
    replicas, replica = trainer.grid.data, trainer.places.replica
    for u in range(case.get("updates", 3)):                 # replica d takes the d-th of each update's mini-batches
        at = (u * replicas + replica) * batch
        trainer.update_mini_batch(x[at:at + batch], y[at:at + batch], case.get("eta", 1.0))
    return trainer, before


def main():
    cases = json.loads(sys.argv[1])
    (data, y), _ = fastckpt.load_mnist()
    for case in cases:
        x = data if not case.get("x_dtype") else data.astype(case["x_dtype"])   # another dtype: converted
        if case.get("memray"):                                 # warm-up, under memray too: kernels, BLAS, MPI's
            memray_peak(lambda c=case, x=x: run(c, x, y, gather=False))       # buffers, memray's
            held = []
            peak = memray_peak(lambda c=case, h=held, x=x: h.append(run(c, x, y, gather=False)))
            trainer = held[0][0]
            rows = trainer.comm.gather((peak, trainer.predicted_bytes()))
            if trainer.comm.Get_rank() == 0:     # world rank 0 alone: every replica's (and shard's) stage 0 raced
                with open(case["out"], "w") as f:
                    json.dump(rows, f)
            continue
        trainer, before = run(case, x, y)
        after = trainer.gather()
        bubble = trainer.bubble_fraction()                 # a collective
        # every replica's copy of a stage holds the same bits
        digests = trainer.comm.allgather(((trainer.places.stage, trainer.places.shard),
                                          hashlib.sha256(trainer.params.flat.tobytes()).hexdigest()))
        agree = all(len({d for s, d in digests if s == stage}) == 1 for stage, _ in digests)
        if trainer.comm.Get_rank() == 0:
            np.savez(case["out"], *after[0], *after[1], *before[0], *before[1], loss=trainer.last_loss,
                     bubble=bubble, replicas_agree=agree)


if __name__ == "__main__":
    main()
