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
