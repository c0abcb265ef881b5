"""Training machinery: optimizer groups, schedules, checkpoints, metrics, evaluation. Used by train.py and eval/."""
