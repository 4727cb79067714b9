"""Pipeline parallelism's parts of the one trainer (:mod:`fastckpt.parallel.trainer`): a stage, the schedules of
its micro-batches, the partition of the layers, the links between stages and their transport codecs."""
