"""FSDP2 fine-tuning of Hugging Face causal LMs under Ray Train (`python -m trainer local` first)."""
