"""Beyond one machine: sampling stages on Ray actors and training ranks over nodes.

`placement` chooses, from a profile's `cluster` section, what a stage samples with and where its
DeepSpeed ranks start; with no cluster configured it returns today's one-machine answers and
Ray is never imported. Only the modules it loads for a configured cluster (`connect`,
`actors`, `ray_nodes`) import Ray, lazily: Ray is the optional `cluster` extra.
"""
