"""The training data.

sources: where records come from (hub, files, s3://, read through `datasets`); formats: TRL's
record formats, chat rendering and loss masks; packing: documents packed into rows, cached.
"""
