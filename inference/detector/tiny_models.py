"""Tiny stand-ins for the detector's models, built offline in a few seconds.

- a randomly initialised 2-layer `DebertaV2ForSequenceClassification` (labels BENIGN / INJECTION /
  JAILBREAK) with a WordPiece tokenizer over an explicit vocabulary, saved as a Hugging Face
  directory and installed through the REAL importer (ONNX export included);
- a tiny GLiNER over a local 2-layer DeBERTa-v2 backbone, saved and installed through the REAL
  importer (which makes it self-contained: the backbone directory is deleted afterwards).

Random weights: Classify scores are meaningful only as numbers to compare with torch; the GLiNER
cannot pass the anti-collapse canary (which is what the inert-model test needs).

For tests and benches (tests/fixtures/detector_models.py, bench/detector.py), never loaded by a
deployment; it needs the detector extra (torch, transformers, gliner, onnx).
"""

from __future__ import annotations

import pathlib
import shutil
from dataclasses import dataclass
from typing import Any

LABELS = {0: "BENIGN", 1: "INJECTION", 2: "JAILBREAK"}
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
WORDS = ["ignore", "previous", "instructions", "the", "you", "are", "now", "hello", "world", "system",
         "prompt", "my", "name", "is", "born", "living", "at", "rue", "de", "paris", "march", "street"]


@dataclass(frozen=True)
class TinyModels:
    models_dir: pathlib.Path  # holds prompt-guard-86m/ and gliner-small-v2.1/ as the service expects
    classifier_hf_dir: pathlib.Path  # the Hugging Face directory the ONNX artifact was exported from
    gliner_dir: pathlib.Path


def _tokenizer():
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    chars = list("abcdefghijklmnopqrstuvwxyz0123456789")
    vocab_list = SPECIALS + chars + list(".,;:!?'\"()-/") + ["##" + c for c in chars] + WORDS
    vocab = {token: index for index, token in enumerate(dict.fromkeys(vocab_list))}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])])
    tok.decoder = decoders.WordPiece()
    return tok, vocab


def _save_tokenizer(directory: pathlib.Path) -> int:
    from transformers import PreTrainedTokenizerFast

    tok, vocab = _tokenizer()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]", model_max_length=512).save_pretrained(directory)
    return len(vocab)


def _deberta_config(vocab_size: int, **extra):
    from transformers import DebertaV2Config

    return DebertaV2Config(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=512, pad_token_id=0, **extra)


def build_tiny_classifier(directory: pathlib.Path) -> pathlib.Path:
    import torch
    from transformers import DebertaV2ForSequenceClassification

    directory.mkdir(parents=True, exist_ok=True)
    vocab_size = _save_tokenizer(directory)
    torch.manual_seed(1234)
    # A wide initialisation, so that scores differ visibly between texts (and between windows).
    config = _deberta_config(vocab_size, num_labels=3, id2label=LABELS, initializer_range=0.5,
                             label2id={v: k for k, v in LABELS.items()})
    model = DebertaV2ForSequenceClassification(config).eval()
    with torch.no_grad():
        model.pooler.dense.weight.normal_(0.0, 0.2)
        model.classifier.weight.normal_(0.0, 0.5)
    model.save_pretrained(directory)
    return directory


def build_tiny_gliner(directory: pathlib.Path, backbone: pathlib.Path) -> pathlib.Path:
    import torch
    from gliner import GLiNER, GLiNERConfig
    from transformers import DebertaV2Model

    backbone.mkdir(parents=True, exist_ok=True)
    vocab_size = _save_tokenizer(backbone)
    torch.manual_seed(4321)
    DebertaV2Model(_deberta_config(vocab_size)).save_pretrained(backbone)
    config = GLiNERConfig(model_name=str(backbone), hidden_size=32, max_width=12, max_len=384, span_mode="markerV0")
    model = GLiNER.from_config(config, backbone_from_pretrained=True, local_files_only=True)
    model.save_pretrained(str(directory))
    return directory


def build_tiny_models(root: pathlib.Path) -> TinyModels:
    """Build both tiny models under `root` and install them with the real importer."""
    from inference.detector.importer import import_gliner, import_prompt_guard

    models_dir = root / "models"
    hf_dir = build_tiny_classifier(root / "hf-prompt-guard")
    import_prompt_guard(hf_dir, models_dir, revision="tiny-test")
    backbone = root / "gliner-backbone"
    gliner_src = build_tiny_gliner(root / "gliner-src", backbone)
    installed = import_gliner(gliner_src, models_dir, revision="tiny-test")
    shutil.rmtree(backbone)  # proves the installed copy no longer needs it
    return TinyModels(models_dir=models_dir, classifier_hf_dir=hf_dir, gliner_dir=installed)


def _sentencepiece_backbone(directory: pathlib.Path) -> None:
    """A DeBERTa-v3 backbone laid out as microsoft/deberta-v3-small is on the Hub (config.json,
    spm.model, tokenizer_config.json; no tokenizer.json): a SentencePiece model trained on a few
    sentences, one thread (in one build the tokenizer and the GLiNER on it come from one training)."""
    import io

    import sentencepiece as spm

    directory.mkdir(parents=True, exist_ok=True)
    sentences = [" ".join(WORDS), "My name is Jo and I live at 78 Rue de Rivoli, Paris.",
                 "Born on 4 March 1987. Call me on 555 0100 or write to jo@example.com."] * 8
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=80, hard_vocab_limit=False,
        model_type="unigram", character_coverage=1.0, num_threads=1, pad_id=0, bos_id=1, eos_id=2, unk_id=3,
        pad_piece="[PAD]", bos_piece="[CLS]", eos_piece="[SEP]", unk_piece="[UNK]", user_defined_symbols=["[MASK]"],
        minloglevel=2)
    (directory / "spm.model").write_bytes(model.getvalue())
    (directory / "tokenizer_config.json").write_text(
        '{"do_lower_case": false, "vocab_type": "spm", "tokenizer_class": "DebertaV2Tokenizer"}\n')
    from transformers import AutoTokenizer

    vocab_size = len(AutoTokenizer.from_pretrained(str(directory), local_files_only=True))
    _deberta_config(vocab_size).save_pretrained(directory)


CANARY_WORD = "Jo"  # the one-word canary the tiny GLiNER of build_tiny_hub_repos gives a PII class


def _tiny_gliner_on(backbone: pathlib.Path, vocab_size: int, seed: int, work: pathlib.Path) -> Any:
    """A tiny GLiNER with random weights (from `seed`) over `backbone`'s tokenizer."""
    import torch
    from gliner import GLiNER, GLiNERConfig
    from transformers import DebertaV2Model

    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(backbone, work)
    torch.manual_seed(seed)
    DebertaV2Model(_deberta_config(vocab_size)).save_pretrained(work)
    config = GLiNERConfig(model_name=str(work), hidden_size=32, max_width=12, max_len=384, span_mode="markerV0")
    model = GLiNER.from_config(config, backbone_from_pretrained=True, local_files_only=True).eval()
    shutil.rmtree(work)
    return model


def _names_a_class(model: Any, word: str, margin: float = 0.005) -> bool:
    """Whether the model's best label for `word` alone maps to a PII class, ahead of the next label
    by `margin` (float differences between CPUs are ~1e-6)."""
    from inference.detector.gliner_pii import LABEL_TO_CLASS, PROMPT_LABEL_NAMES

    spans = model.inference([word], list(PROMPT_LABEL_NAMES), flat_ner=False, threshold=0.0, multi_label=True)[0]
    scores = sorted(((s["score"], s["label"]) for s in spans if (s["start"], s["end"]) == (0, len(word))),
                    reverse=True)
    return len(scores) > 1 and scores[0][1] in LABEL_TO_CLASS and scores[0][0] - scores[1][0] >= margin


def build_tiny_hub_repos(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """The three repositories `models fetch` downloads, laid out as on the Hub with the files this
    build's manifest names (inference/detector/model_manifest.py), holding tiny models: Prompt-Guard's
    Hugging Face directory, a GLiNER save that names its backbone without embedding it (as
    gliner_small-v2.1 does), and the backbone's config and SentencePiece tokenizer. The GLiNER is
    the first of its seeds that gives CANARY_WORD a PII class, so that a service can be given a
    canary it passes (a randomly initialised model finds nothing real)."""
    import json

    from inference.detector.model_manifest import MANIFEST

    classifier = build_tiny_classifier(root / "prompt-guard")
    specials = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]", "unk_token": "[UNK]",
                "mask_token": "[MASK]"}
    (classifier / "special_tokens_map.json").write_text(json.dumps(specials))
    backbone = root / "backbone"
    _sentencepiece_backbone(backbone)
    vocab_size = json.loads((backbone / "config.json").read_text())["vocab_size"]
    built = root / "gliner-built"
    for seed in range(100):
        model = _tiny_gliner_on(backbone, vocab_size, seed, root / "backbone-with-weights")
        if _names_a_class(model, CANARY_WORD):
            model.save_pretrained(str(built))
            break
    else:
        raise RuntimeError(f"no seed below 100 gives {CANARY_WORD!r} a PII class")
    gliner = root / "gliner"
    gliner.mkdir()
    shutil.copy(built / "pytorch_model.bin", gliner / "pytorch_model.bin")
    saved = json.loads((built / "gliner_config.json").read_text())
    saved.pop("encoder_config", None)
    saved["model_name"] = MANIFEST["gliner-backbone"]["repo"]
    (gliner / "gliner_config.json").write_text(json.dumps(saved))
    shutil.rmtree(built)
    repos = {MANIFEST["prompt-guard"]["repo"]: classifier, MANIFEST["gliner"]["repo"]: gliner,
             MANIFEST["gliner-backbone"]["repo"]: backbone}
    for key in ("prompt-guard", "gliner", "gliner-backbone"):
        held = sorted(p.name for p in repos[MANIFEST[key]["repo"]].iterdir())
        assert held == sorted(MANIFEST[key]["files"]), (key, held)
    return repos
