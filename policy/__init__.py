"""raytrain-eks policy pack. `rules` holds the logic as pure functions; `pack` adapts it to pulumi_policy."""
