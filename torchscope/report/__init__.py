"""Report stage: the serialisable Report (analysis results + findings), the only input of renderers."""
