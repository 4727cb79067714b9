"""Reports: the ``compare`` job and its summary, plots, memray's peak and its icicle chart, the machine line.
Imports the nets and everything below them; never the parallel trainers."""
