"""The training configuration.

flags: every training flag declared once, as a field of the frozen TrainConfig; trl: the
TRL/transformers YAML keys mapped onto it; load: defaults < YAML < command-line flags.
"""
