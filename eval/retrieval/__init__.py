"""Teacher-forced retrieval probes (needle log-likelihood gain, passkey rank) over context lengths × needle depths:
``run`` evaluates, ``plot`` draws heatmaps."""
