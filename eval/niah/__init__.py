"""Needle-in-a-haystack retrieval test (standard and easy modes): ``run`` evaluates, ``plot`` draws heatmaps."""
