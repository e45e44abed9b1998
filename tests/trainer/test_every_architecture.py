"""Every causal-LM model type transformers registers (enumerated from transformers now, not a list of ours) trains
right or is refused before Ray with its reason.

One sweep (trainer.loop.behaviour.survey, what the pre-flight runs for a model, from each type's default config
shrunk to hidden 32, 2 layers, vocabulary 96) gives every type a verdict; one tiny model per type is reused for:
- the document-boundary property, checked again here on other documents through the real packing code: a type
  that packs gives each document of a shared row exactly its logits alone; a type trained one document per row
  really mixes documents in a shared row (the verdict is not vacuous) and gets its own logits in its own row;
- the equality with `from_pretrained`: the trainer's sharded build of the saved tiny model equals transformers'
  own load of it, every parameter and buffer, and the pre-flight's checkpoint check accepts the folder; the same
  build with --random-init writes every tensor;
- docs/architectures.md's table is this sweep's table (`python -m trainer.loop.behaviour` prints it).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch

from tests.guards import nonempty
from trainer.data.packing import pack
from trainer.loop import behaviour
from trainer.loop.behaviour import ONE_PER_ROW, PACKED, REFUSED
from trainer.loop.step import model_inputs

from .test_architectures import assert_same_tensors, every_tensor

pytestmark = pytest.mark.slow  # the sweep builds every registered architecture: the whole suite, not the fast tier

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architectures.md"
BEGIN, END = "<!-- every-architecture table: begin -->", "<!-- every-architecture table: end -->"
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models: their ops are overhead, and threads fighting over a busy machine's cores made each forward
    tens of times slower (trainer.loop.behaviour measures on one thread too)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sweep(one_thread):
    keep: dict = {}
    started = time.perf_counter()
    found = behaviour.survey(keep=keep)
    print(f"\nsweep: {len(found)} types in {time.perf_counter() - started:.1f} s: {behaviour.counts(found)}")
    return found, keep


def docs_table() -> str:
    text = DOCS.read_text()
    return text[text.index(BEGIN) + len(BEGIN):text.index(END)].strip() + "\n"


def test_every_registered_type_has_a_verdict_and_the_docs_table_is_the_sweeps(sweep):
    found, kept = sweep
    assert sorted(found) == behaviour.registered_types() and len(found) > 150
    for model_type, b in nonempty(found.items(), "types"):
        assert b.packing in (PACKED, ONE_PER_ROW, REFUSED), model_type
        if b.packing == REFUSED:  # with the reason, naming what to change
            assert b.problems and re.match(r"(--[a-z-]+|transformers' default config)", b.reason), (model_type, b)
        else:
            assert not b.problems and model_type in kept, model_type
    assert docs_table() == behaviour.table(found), "docs/architectures.md: run `python -m trainer.loop.behaviour`"


def _doc(n: int, vocab: int, g: torch.Generator) -> tuple[list[int], list[bool]]:
    return torch.randint(min(3, vocab - 1), vocab, (n,), generator=g).tolist(), [True] * n


def _rows_logits(model, arrays) -> torch.Tensor:
    batch = {k: torch.from_numpy(arrays[k]).long() for k in ("input_ids", "position_ids")}
    with torch.no_grad():
        return model(**model_inputs(model, batch)).logits.float()


def test_packed_rows_never_mix_documents_for_any_type_that_trains(sweep):
    """Other documents than the measurement's (lengths 5 and 11), laid out by trainer.data.packing.pack itself."""
    found, kept = sweep
    wrong = []
    for model_type, model in nonempty(sorted(kept.items()), "trained types"):
        verdict = found[model_type].packing
        vocab = model.get_output_embeddings().weight.shape[0]
        g = torch.Generator().manual_seed(1)
        first, second = _doc(5, vocab, g), _doc(11, vocab, g)
        shared, stats = pack([first, second], 19, 0)  # best fit: both in one row, padding after
        own, own_stats = pack([first, second], 19, 0, one_per_row="measured")
        assert stats.rows == 1 and own_stats.rows == 2 and own_stats.packed_rows == 1
        try:
            alone = _rows_logits(model, pack([second], 11, 0)[0])[0]
            mixed = behaviour._differ(_rows_logits(model, shared)[0, 5:16], alone)
            by_itself = behaviour._differ(_rows_logits(model, own)[1, :11], alone)
        except Exception as e:  # noqa: BLE001 - every type's failure is listed, not only the first
            wrong.append(f"{model_type}: {type(e).__name__}: {str(e)[:200]}")
            continue
        if verdict == PACKED and mixed > behaviour.TOLERANCE:
            wrong.append(f"{model_type}: packs, but the second document's logits differ by {mixed:.1e}")
        if verdict == ONE_PER_ROW and mixed <= behaviour.TOLERANCE:
            wrong.append(f"{model_type}: one per row, but a shared row does not mix documents")
        if verdict == ONE_PER_ROW and by_itself > behaviour.TOLERANCE:
            wrong.append(f"{model_type}: its own row gives a document other logits ({by_itself:.1e})")
    assert not wrong, wrong


def test_every_type_that_trains_is_built_exactly_as_from_pretrained_builds_it(sweep, process_group, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM

    from trainer.model.build import build_model, check_architecture, check_checkpoint
    from trainer.model.errors import UnsupportedArchitecture

    found, kept = sweep
    wrong = []
    for model_type, model in nonempty(sorted(kept.items()), "trained types"):
        attn = found[model_type].attn_implementation
        folder = tmp_path / model_type
        model.save_pretrained(folder)
        try:
            want = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attn)
        except ValueError as e:  # a text config transformers itself maps to no causal LM (Emu3's, Mllama's)
            if "Unrecognized configuration class" not in str(e):
                raise
            with pytest.raises(UnsupportedArchitecture, match="transformers has no causal-LM class"):
                check_architecture(AutoConfig.from_pretrained(folder))  # the trainer refuses the folder alike
            continue
        try:
            check_checkpoint(model.config, folder)
            got = build_model(folder, device=CPU, use_gpu=False, attn_implementation=attn)
            assert_same_tensors(every_tensor(got), every_tensor(want), model_type)
            random_init(folder, attn, model.config, wrong)
        except Exception as e:  # noqa: BLE001 - every type's failure is listed, not only the first
            wrong.append(f"{model_type}: {type(e).__name__}: {str(e)[:300]}")
    assert not wrong, wrong


def random_init(folder: Path, attn: str, config, wrong: list[str]) -> None:
    """--random-init through the same sharded build writes every tensor (none left NaN), or the pre-flight's
    measurement refuses --random-init for that architecture too (transformers' init leaves e.g. XIELU's
    activation parameters to the checkpoint)."""
    from trainer.model.build import build_model
    from trainer.model.errors import UnsupportedArchitecture

    try:
        build_model(folder, device=CPU, use_gpu=False, attn_implementation=attn, random_init=True)
    except UnsupportedArchitecture as e:
        found = behaviour.measure(config, attn_implementation=attn, random_init=True)
        if not (found.packing == REFUSED and found.reason.startswith("--random-init")):
            wrong.append(f"{folder.name}: --random-init fails to build ({e}) but the pre-flight accepts it")
