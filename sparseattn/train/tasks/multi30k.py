"""The `multi30k` task: English -> German translation on Multi30k-format files, scored by BLEU.

    sparseattn train --task multi30k --data-dir data/multi30k --out runs/m30k

Data: `--data-dir` holds train/val/test_2016_flickr.{en,de} (parallel_text.py). The joint
BPE vocabulary is trained on both sides of the training split and saved as RUN/tokenizer.json;
a resumed or evaluated run loads it from there, and its content also travels in the checkpoint's
task state (so a checkpoint copied on its own still decodes). Sources end with `</s>`.

Batches: with `max_tokens` > 0, pairs are grouped by a token budget (source + target + EOS
tokens per batch, `token_batches`) over length buckets; otherwise `batch_size` sentences.

Splits: "train", "val" and "test" (test_2016_flickr). "valid" is what the training loop scores
after each epoch: val with greedy decoding on its first `valid_bleu_sentences` sentences (cheap);
`evaluate --split val|test` decodes the whole split with `beam` and `alpha` (5 and 0.6 in the
preset), writes the detokenized hypotheses to RUN/hyp.{split}.de and reports sacrebleu's corpus
BLEU against the raw references.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from ... import record_attention
from ...models import token_batches
from ..config import at_least, cfg_field
from ..metrics import sequence_accuracy, token_accuracy
from .base import Seq2SeqTask, epoch_seed, register_task
from .parallel_text import SubwordVocab, read_parallel

TOKENIZER_FILE = "tokenizer.json"


@dataclass
class Multi30kConfig:
    """Where the Multi30k files are, and the subword vocabulary."""

    data_dir: str = cfg_field("", "folder with Multi30k-format {train,val,test_2016_flickr}.{en,de}")
    vocab_size: int = cfg_field(8000, "joint BPE vocabulary size", check=at_least(8))
    valid_bleu_sentences: int = cfg_field(
        200, "val sentences greedily decoded for BLEU after each epoch", check=at_least(1)
    )


def _is_main() -> bool:
    return (
        not (torch.distributed.is_available() and torch.distributed.is_initialized())
        or torch.distributed.get_rank() == 0
    )


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


@register_task("multi30k", config=Multi30kConfig)
class Multi30kTask(Seq2SeqTask):
    FILE_SPLITS = ("train", "val", "test")

    def __init__(self) -> None:
        super().__init__()
        self.text: Dict[str, Tuple[List[str], List[str]]] = {}
        self.vocab: Optional[SubwordVocab] = None
        self.max_source_len: Optional[int] = None  # subword tokens of the longest training source

    def setup(self, cfg) -> None:
        data = cfg.task_cfg
        if not data.data_dir:
            raise ValueError(
                "task multi30k needs --data-dir DIR with train/val/test_2016_flickr.{en,de} "
                "(see docs/guide/translation.md)"
            )
        out_dir = Path(cfg.run.out)
        self.text = {name: read_parallel(data.data_dir, name) for name in self.FILE_SPLITS}
        path = out_dir / TOKENIZER_FILE
        if _is_main() and not path.exists():  # under torchrun rank 0 trains it, the others wait
            src, tgt = self.text["train"]
            out_dir.mkdir(parents=True, exist_ok=True)
            SubwordVocab.train(src + tgt, vocab_size=data.vocab_size, min_frequency=2).save(str(path))
        _barrier()
        self._set_vocab(SubwordVocab.load(str(path)))

    def _set_vocab(self, vocab: SubwordVocab) -> None:
        self.vocab = self.src_vocab = self.tgt_vocab = vocab
        self.bos, self.eos = vocab.bos, vocab.eos
        for name, (src, tgt) in self.text.items():
            self.splits[name] = ([ids + [vocab.eos] for ids in vocab.encode_batch(src)], vocab.encode_batch(tgt))
        if "val" in self.splits:
            self.splits["valid"] = self.splits["val"]
        if "train" in self.splits:
            self.max_source_len = max((len(ids) - 1 for ids in self.splits["train"][0]), default=None)

    def model_info(self) -> dict:
        return dict(src_vocab_size=len(self.vocab), tgt_vocab_size=len(self.vocab), shared_vocab=True)

    def batch_indices(self, split: str, cfg, epoch: Optional[int]) -> List[List[int]]:
        if not cfg.run.max_tokens:
            return super().batch_indices(split, cfg, epoch)
        src, tgt = self.splits[split]
        return token_batches(
            [len(s) + len(t) + 1 for s, t in zip(src, tgt)], cfg.run.max_tokens, epoch_seed(cfg, epoch)
        )

    def source_lengths(self, sentences: Sequence[str]) -> List[int]:
        """Subword tokens of each raw source sentence (without `</s>`)."""
        return [len(ids) for ids in self.vocab.encode_batch(list(sentences))]

    def translate(
        self, model, sentences: Sequence[str], cfg, beam: Optional[int] = None, max_source_len: Optional[int] = None
    ) -> List[str]:
        """Detokenized translations of raw source sentences, each cut to its first `max_source_len`
        subword tokens when given."""
        sources = [ids[:max_source_len] + [self.vocab.eos] for ids in self.vocab.encode_batch(list(sentences))]
        return [self.vocab.decode(p) for p in self.decode(model, sources, cfg, beam)]

    @torch.no_grad()
    def evaluate(self, model, split: str, cfg, decode: bool = True) -> dict:
        """Teacher-forced loss/accuracy and, when decoding, BLEU (see the module docstring)."""
        import sacrebleu

        metrics = super().evaluate(model, split, cfg, decode=False)
        if not decode:
            return metrics
        per_epoch = split == "valid"
        n = (
            min(cfg.task_cfg.valid_bleu_sentences, len(self.splits[split][0]))
            if per_epoch
            else len(self.splits[split][0])
        )
        text_split = "val" if per_epoch else split
        sources, refs = self.text[text_split][0][:n], self.text[text_split][1][:n]
        was_training = model.training
        hyps = self.translate(model, sources, cfg, beam=1 if per_epoch else cfg.run.beam)
        model.train(was_training)
        hyp_ids = self.vocab.encode_batch(hyps)
        metrics["bleu"] = sacrebleu.corpus_bleu(hyps, [refs]).score
        metrics["token_accuracy"] = token_accuracy(hyp_ids, self.splits[split][1][:n])
        metrics["sequence_accuracy"] = sequence_accuracy(hyp_ids, self.splits[split][1][:n])
        if not per_epoch and _is_main():
            out_dir = Path(cfg.run.out)  # the run folder (an --overwrite run set up in another: trainer.py)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"hyp.{split}.de").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
        return metrics

    @torch.no_grad()
    def plot(self, model, cfg, out_dir, history: list, sentence: Optional[str] = None) -> list:
        """Attention maps (encoder, decoder, cross) of one sentence (default: the first test source)
        and the model's own translation of it, axes labelled with the subword tokens."""
        from ..plots import attention_maps

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        sentence = self.text["test"][0][0] if sentence is None else sentence
        was_training = model.training
        hyp = self.translate(model, [sentence], cfg)[0]
        src = self.vocab.encode(sentence) + [self.vocab.eos]
        tgt = self.vocab.encode(hyp)
        model.eval()
        batch = self.pool.batch([src], [tgt], bos=self.vocab.bos, eos=self.vocab.eos)
        with record_attention(model) as records:
            model(batch.to(next(model.parameters()).device))
        model.train(was_training)
        token = self.vocab.tokenizer.id_to_token
        labels = {"src": [token(i) for i in src], "tgt_in": ["<s>"] + [token(i) for i in tgt]}
        return attention_maps(records, labels, out_dir)

    def state_dict(self) -> dict:
        return {"tokenizer": self.vocab.tokenizer.to_str(), "max_source_len": self.max_source_len}

    def load_state_dict(self, state: dict) -> None:
        if isinstance(state.get("max_source_len"), int):  # absent from older checkpoints
            self.max_source_len = state["max_source_len"]
        saved = state.get("tokenizer")
        if saved and (self.vocab is None or saved != self.vocab.tokenizer.to_str()):
            from tokenizers import Tokenizer

            self._set_vocab(SubwordVocab(Tokenizer.from_str(saved)))
