"""Pipeline parallelism: the trainer, its stages, schedules, partition, links and transport codecs."""
from .trainer import PipelineTrainer

__all__ = ["PipelineTrainer"]
