"""raytrain-eks policy pack. `rules` registers the rules (by concern in nodes, network, ray and pinning, over
`model`'s plain data) as pure functions; `pack` adapts them to pulumi_policy."""
