"""The demo's tokenizer is the one the trainer gets back when it loads the demo's model folder."""
from __future__ import annotations

from trainer import demo
from trainer.model.sources import load_tokenizer

TEXT = "<|im_start|>user\nsort: ab cd<|im_end|>\n<|im_start|>assistant\nAB xuserq<|im_end|>\n"


def test_the_saved_demo_model_reloads_with_the_tokenizer_it_was_built_with(tmp_path):
    built = demo.build_tokenizer()
    folder = demo.write_init_model(tmp_path / "init-model", seed=0)
    loaded = load_tokenizer(folder)  # AutoTokenizer, as the workers load it: config.json says qwen2
    ids = built(TEXT, add_special_tokens=False)["input_ids"]
    assert loaded(TEXT, add_special_tokens=False)["input_ids"] == ids
    assert loaded.decode(ids) == TEXT  # spaces and newlines survive
    assert [built.convert_ids_to_tokens(i) for i in built("user", add_special_tokens=False)["input_ids"]] == ["user"]
    assert len(loaded) <= demo.model_config().vocab_size
    assert (loaded.eos_token_id, loaded.pad_token_id) == (demo.model_config().eos_token_id,
                                                         demo.model_config().pad_token_id)
