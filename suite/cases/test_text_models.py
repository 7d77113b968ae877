"""Text workloads (DistilBERT, BigBird), their data, named recipes, and the 8-bit optimizers at
smoke scale through the real runner.

Runs are cached per module; smoke runs take 1 intra-op thread (see ``one_thread``).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator

import pytest
import torch

from fixtures.messages import differs, not_related
from memclaims.core import published
from memclaims.core.errors import DataError
from memclaims.core.record import Record
from memclaims.measure import active, lightning_fsdp
from memclaims.measure.runner import run
from memclaims.recipes import requirements
from memclaims.recipes.named import NAMED_RECIPES
from memclaims.recipes.recipe import parse_id, resolve
from memclaims.recipes.run_options import RunOptions
from memclaims.workloads.data import PadToLongest, SyntheticReviews, imdb_rows
from memclaims.workloads.registry import WORKLOADS, workload
from memclaims.workloads.text import TEXT_MODELS, config, text_data

ACCURACY_TOLERANCE = 0.05  # 8-bit states may cost at most 5 points of smoke accuracy vs AdamW
LEARNED = 0.9  # chance is 0.5 on the balanced synthetic set


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    # Other test processes share the two cores; one intra-op thread avoids OpenMP spin contention.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*padded.*")  # BigBird pads to its block size
        yield
    torch.set_num_threads(threads)


_RUNS: dict[tuple[str, str, tuple[str, ...], bool, bool], Record] = {}


def smoke(workload_name: str, *techniques: str, evaluate: bool = True, each_epoch: bool = False) -> Record:
    """The smoke run, once per module; ``each_epoch``: evaluated after every epoch too (the course's log)."""
    key = (workload_name, "smoke", techniques, evaluate, each_epoch)
    if key not in _RUNS:
        _RUNS[key] = run(resolve(workload_name, "smoke", techniques),
                         RunOptions(device="cpu", evaluate=evaluate, evaluate_each_epoch=each_epoch))
    return _RUNS[key]


# --- workloads and configs ----------------------------------------------------------------------


@pytest.mark.cpu
def test_registered() -> None:
    assert {"distilbert", "distilbert-cased", "bigbird"} <= set(WORKLOADS)
    for name in ("distilbert", "distilbert-cased", "bigbird"):
        assert set(workload(name).scales) == {"smoke", "article"}
        assert workload(name).num_classes == 2
    assert workload("distilbert").scale("article").batch_size == 12
    assert workload("bigbird").scale("article").batch_size == 12


@pytest.mark.cpu
def test_configs_are_the_hub_models() -> None:
    article = workload("distilbert-cased").scale("article")
    cased = config(TEXT_MODELS["distilbert-cased"], article)
    uncased = config(TEXT_MODELS["distilbert"], article)
    assert (cased.vocab_size, uncased.vocab_size) == (28996, 30522)
    assert {k: v for k, v in cased.to_dict().items() if k != "vocab_size"} == \
        {k: v for k, v in uncased.to_dict().items() if k != "vocab_size"}
    assert (cased.n_layers, cased.dim, cased.hidden_dim, cased.num_labels) == (6, 768, 3072, 2)
    bird = config(TEXT_MODELS["bigbird"], workload("bigbird").scale("article"))
    assert (bird.max_position_embeddings, bird.attention_type, bird.block_size, bird.num_random_blocks) == \
        (4096, "block_sparse", 64, 3)
    assert (bird.vocab_size, bird.num_hidden_layers, bird.hidden_size) == (50358, 12, 768)


@pytest.mark.cpu
@pytest.mark.parametrize("name", ["distilbert", "distilbert-cased", "bigbird"])
def test_smoke_models_build_eager_and_random(name: str) -> None:
    model, weights = workload(name).build_model(workload(name).scale("smoke"))
    assert weights == "random"
    assert model.config._attn_implementation == "eager"
    assert model.config.num_labels == 2
    assert sum(p.numel() for p in model.parameters()) < 200_000


@pytest.mark.cpu
def test_pretrained_only_from_the_local_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    import memclaims.workloads.text as text

    calls: list[dict] = []

    def fake_from_pretrained(name: str, **kwargs: object) -> torch.nn.Module:
        calls.append(dict(kwargs, name=name))
        return torch.nn.Linear(1, 1)

    assert text._cached_weights("no-such-org/no-such-model") is False  # a cache miss, not a download
    article = workload("distilbert-cased").scale("article")
    monkeypatch.setattr(transformers.AutoModelForSequenceClassification, "from_pretrained", fake_from_pretrained)
    monkeypatch.setattr(text, "_cached_weights", lambda hub_name: True)
    _, weights = workload("distilbert-cased").build_model(article)
    assert weights == "pretrained"
    assert calls[0]["name"] == "distilbert-base-cased" and calls[0]["local_files_only"] is True
    assert calls[0]["attn_implementation"] == "eager"


# --- data ---------------------------------------------------------------------------------------


@pytest.mark.cpu
def test_synthetic_data_is_deterministic_balanced_and_padded() -> None:
    a, b = SyntheticReviews(256, 7, 8, 62), SyntheticReviews(256, 7, 8, 62)
    assert all(torch.equal(a[i][0], b[i][0]) and a[i][1] == b[i][1] for i in range(32))
    labels = [a[i][1] for i in range(256)]
    assert 0.4 < sum(labels) / len(labels) < 0.6
    inputs, targets = PadToLongest(0)([a[i] for i in range(8)])
    longest = max(len(a[i][0]) for i in range(8))
    assert inputs["input_ids"].shape == inputs["attention_mask"].shape == (8, longest)
    assert int(inputs["attention_mask"].sum()) == sum(len(a[i][0]) for i in range(8))
    assert targets.tolist() == labels[:8]
    bundle = text_data(TEXT_MODELS["distilbert"], workload("distilbert").scale("article"), None)
    assert bundle.name == "synthetic-sentiment" and len(bundle.train) == 35_000 and len(bundle.test) == 10_000
    assert max(len(bundle.train[i][0]) for i in range(64)) <= 512


@pytest.mark.cpu
def test_data_dir_without_imdb_is_a_data_error(tmp_path) -> None:
    with pytest.raises(DataError, match=str(tmp_path)):
        workload("distilbert").load_data(workload("distilbert").scale("smoke"), tmp_path)


@pytest.mark.cpu
def test_imdb_from_the_articles_csvs(tmp_path) -> None:
    for split, n in (("train", 3), ("val", 1), ("test", 2)):
        rows = "".join(f"{i},review {i} of {split},{i % 2}\n" for i in range(n))
        (tmp_path / f"{split}.csv").write_text("index,text,label\n" + rows)
    train, val, test = imdb_rows(tmp_path)
    assert (len(train), len(val), len(test)) == (3, 1, 2) and train[1] == ("review 1 of train", 1)


@pytest.mark.cpu
def test_imdb_from_the_raw_folder(tmp_path) -> None:
    for split in ("train", "test"):
        for label in ("pos", "neg"):
            folder = tmp_path / "aclImdb" / split / label
            folder.mkdir(parents=True)
            for i in range(3):
                (folder / f"{i}_7.txt").write_text(f"{split} {label} {i}")
    train, val, test = imdb_rows(tmp_path)
    assert len(train) + len(val) + len(test) == 12  # 35k/5k/10k of 50k; here all 12 rows land in train
    assert {label for _, label in train} == {0, 1}


# --- named recipes ------------------------------------------------------------------------------


@pytest.mark.cpu
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.requires(r.needs())) for n, r in NAMED_RECIPES.items()])
def test_named_recipe(name: str) -> None:
    recipe = NAMED_RECIPES[name]
    assert recipe.workload in WORKLOADS and recipe.source
    resolved = recipe.resolve()
    assert resolved.workload.name == recipe.workload


@pytest.mark.cpu
def test_named_recipes_carry_the_published_numbers() -> None:
    after = NAMED_RECIPES["distilbert-after"]
    assert (after.published.time_min, after.published.peak_gb, after.published.accuracy_pct) == (5.55, 1.15, 90.43)
    assert NAMED_RECIPES["distilbert-before"].published.peak_gb == 3.99
    assert NAMED_RECIPES["bigbird-after"].published.peak_gb == 4.03
    assert NAMED_RECIPES["bigbird-before"].published.peak_gb is None
    # Offload needs a GPU; the number of GPUs is not a requirement (the Record says how many ran).
    assert after.needs() == requirements.Needs(cuda_devices=1)
    unmet = after.unmet(cuda_devices=0)
    assert len(unmet) == 1 and unmet[0].startswith("needs a CUDA GPU"), unmet
    assert after.unmet(cuda_devices=1) == []
    # The "before" recipes are techniques now: DeepSpeed ZeRO-2 needs its extra (and CUDA), DDP nothing.
    before = NAMED_RECIPES["distilbert-before"]
    assert before.techniques == ("16-mixed", "deepspeed-zero2") and not before.extra_needs
    assert NAMED_RECIPES["bigbird-before"].techniques == ("ddp",) and NAMED_RECIPES["bigbird-before"].unmet() == []
    # BigBird "after": micro-batch 1 x 12, FSDP without an auto-wrap policy, as the script.
    bigbird = NAMED_RECIPES["bigbird-after"].resolve(cuda_devices=1)
    assert (bigbird.batch_size, bigbird.micro_batch_size, bigbird.accumulation_steps) == (12, 1, 12)
    assert lightning_fsdp.strategy(bigbird)._fsdp_kwargs.get("auto_wrap_policy") is None
    distil = NAMED_RECIPES["distilbert-after"].resolve(cuda_devices=1)
    assert (distil.micro_batch_size, distil.accumulation_steps) == (3, 4)


# --- runs through the runner ---------------------------------------------------------------------


@pytest.mark.cpu
def test_article_scale_adamw_state_through_the_runner() -> None:
    """The real runner at article scale; batch 1 instead of 12 (the optimizer state is the same,
    and one 12 x 512 step costs minutes on two shared cores)."""
    recipe = dataclasses.replace(resolve("distilbert-cased", "article", ["adamw"]), batch_size=1)
    record = run(recipe, RunOptions(device="cpu", evaluate=False, memory_steps=1))
    assert record.param_count == 65_783_042, differs(record, "param_count", 65_783_042)
    assert record.optimizer_state_bytes == 526_264_752, differs(record, "optimizer_state_bytes", 526_264_752,
                                                                "AdamW: 2 x 4 B x parameters + step counters")
    assert (record.weights, record.data) == ("random", "synthetic-sentiment"), (
        f"{record.recipe}: weights {record.weights!r}, data {record.data!r}")


@pytest.mark.cpu
def test_smoke_adamw_learns() -> None:
    record = smoke("distilbert-cased", "adamw")
    assert record.accuracy is not None and record.accuracy >= LEARNED, not_related(record, ">=", LEARNED, "accuracy")
    assert not record.nan_loss, f"{record.recipe}: loss diverged at step {record.nan_step}"


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
def test_smoke_adam8bit_peak_and_accuracy() -> None:
    # The run the course's eval-per-epoch test reads too (evaluating between epochs changes nothing else).
    adamw, eight = smoke("distilbert-cased", "adamw"), smoke("distilbert-cased", "adam8bit", each_epoch=True)
    saved_state = adamw.optimizer_state_bytes - eight.optimizer_state_bytes
    assert eight.optimizer_state_bytes <= 0.3 * adamw.optimizer_state_bytes, not_related(
        eight, "<= 0.3 x", adamw, "optimizer_state_bytes")
    inactive = active.problems(parse_id(eight.recipe), eight)
    assert not inactive, "\n".join(inactive)
    # The training-step peak drops by what the state saves (same activations, same gradients).
    assert eight.peak_allocated_bytes < adamw.peak_allocated_bytes, not_related(eight, "<", adamw, "peak_allocated_bytes")
    saved_peak = adamw.peak_allocated_bytes - eight.peak_allocated_bytes
    assert abs(saved_peak - saved_state) <= 0.05 * saved_state, (
        f"{eight.recipe} vs {adamw.recipe}: peak_allocated_bytes fell by {saved_peak:,} B, the optimizer "
        f"state by {saved_state:,} B; they differ by more than 5 %")
    assert eight.accuracy is not None and eight.accuracy >= adamw.accuracy - ACCURACY_TOLERANCE, not_related(
        eight, f">= (tolerance {ACCURACY_TOLERANCE})", adamw, "accuracy")


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
def test_smoke_adam8bit_eval_per_epoch() -> None:
    """course-eval-loss, course-eval-f1: with 8-bit Adam the eval loss falls and the eval F1 rises from
    epoch 1 to epoch 2 (the course: 0.63 -> 0.61, 0.62 -> 0.66 on a data set it does not name), here
    on the smoke model and synthetic reviews: the direction, not the values."""
    record = smoke("distilbert-cased", "adam8bit", each_epoch=True)
    loss, f1 = published.numbers("course-eval-loss"), published.numbers("course-eval-f1")
    assert [e["epoch"] for e in record.epoch_evaluations] == list(range(1, record.accuracy_schedule["epochs"] + 1)), (
        f"{record.recipe}: epoch_evaluations {record.epoch_evaluations}")
    first, second = record.epoch_evaluations[:2]
    shown = (f"{record.recipe}: eval_loss {first['eval_loss']:.4f} -> {second['eval_loss']:.4f} (published "
             f"{loss['eval_loss_1']} -> {loss['eval_loss_2']}), eval_f1 {first['eval_f1']:.4f} -> {second['eval_f1']:.4f} "
             f"(published {f1['epoch_1']} -> {f1['epoch_2']})")
    assert second["eval_loss"] < first["eval_loss"], shown
    assert second["eval_f1"] > first["eval_f1"], shown
    # The last epoch's evaluation is the run's accuracy: the same model, the same test examples.
    assert record.epoch_evaluations[-1]["eval_accuracy"] == pytest.approx(record.accuracy), (
        f"{record.recipe}: last epoch_evaluations {record.epoch_evaluations[-1]} vs accuracy {record.accuracy}")


@pytest.mark.cpu
def test_smoke_adafactor() -> None:
    adamw = smoke("distilbert-cased", "adamw")
    factor = smoke("distilbert-cased", "adafactor", evaluate=False)
    assert factor.optimizer_state_bytes < 0.1 * adamw.optimizer_state_bytes, not_related(
        factor, "< 0.1 x", adamw, "optimizer_state_bytes")
    assert factor.peak_allocated_bytes < adamw.peak_allocated_bytes, not_related(factor, "<", adamw, "peak_allocated_bytes")


@pytest.mark.cpu
@pytest.mark.requires(bitsandbytes="cpu")
def test_smoke_eight_bit_combination() -> None:
    combined = smoke("distilbert", "bf16-true", "grad-accum", "adamw8bit", evaluate=False)
    assert (combined.precision, combined.accumulation_steps) == ("bf16-true", 4), (
        f"{combined.recipe}: precision {combined.precision!r}, accumulation_steps {combined.accumulation_steps}")
    inactive = active.problems(parse_id(combined.recipe), combined)
    assert not inactive, "\n".join(inactive)
    assert not combined.nan_loss, f"{combined.recipe}: loss diverged at step {combined.nan_step}"


@pytest.mark.cpu
def test_smoke_bigbird_trains() -> None:
    record = smoke("bigbird", "adamw", evaluate=False)
    assert record.param_count > 0, differs(record, "param_count", "> 0")
    assert not record.nan_loss, f"{record.recipe}: loss diverged at step {record.nan_step}"
    assert record.weights == "random", differs(record, "weights", "random")
