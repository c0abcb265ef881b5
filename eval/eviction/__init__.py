"""What ACP eviction changes on a trained model (``python -m eval.eviction.run``)."""
