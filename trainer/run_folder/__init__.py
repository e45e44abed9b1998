"""What a run leaves in its folder.

checkpoint: the sharded checkpoint format and its marker; record: run.json and the model card;
export: the Hugging Face model folder; resume: what a folder may resume with.
"""
