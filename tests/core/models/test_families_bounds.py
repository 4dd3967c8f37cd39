"""Where a model's own tokenizer does not ship (Claude's current one, Gemini versions no SDK maps, Gemma 3n, Llama 2,
unknown models), the count is an upper bound: never under any real vocabulary it stands for on
any text of the corpus, and on prose (other than Chinese and Japanese, which cl100k_base, the
bound's base, spends more tokens on than these vocabularies do) it loses at most a fifth of the window."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.core.counting.bound import BOUNDS, TERMS_WINDOW, BoundTerms, BoundTokenizer, class_terms
from proxy.core.models.model_registry import TokenizerSpec
from proxy.tokenizers.family_vocabularies import VOCABULARIES, load_vocabulary
from proxy.tokenizers.vocabularies import Tokenizers, TokenizerUnavailable, bundled_encodings_dir

CORPUS: dict[str, str] = json.loads((Path(__file__).parents[2] / "data/families/corpus.json").read_text("utf-8"))
PROSE = sorted(k for k in CORPUS if k.startswith("prose_"))
CJK_PROSE = {"prose_chinese", "prose_japanese"}


@functools.cache
def legacy_claude() -> Callable[[str], int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(bundled_encodings_dir() / "anthropic_tokenizer.json"))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


@functools.cache
def every_vocabulary() -> Callable[[str], int]:
    """The largest count of any real vocabulary that ships offline, legacy Claude's included (Gemma 4's
    and Llama 2's, which ship in no package, are checked against their pinned counts below)."""
    encoders = [load_vocabulary(name) for name in VOCABULARIES]
    return lambda text: max(legacy_claude()(text), *(len(encode(text)) for encode in encoders))


REFERENCES = {"claude": legacy_claude, "open": every_vocabulary}
PINNED = json.loads((Path(__file__).parents[2] / "data/families/gguf_counts.json").read_text("utf-8"))


def real(name: str, kind: str) -> int:
    """The count `bound:<name>` must not fall below on a corpus text (for `open`, Gemma 4's and
    Llama 2's pinned counts too)."""
    count = REFERENCES[name]()(CORPUS[kind])
    return max(count, PINNED["gemma-4"][kind], PINNED["llama-spm"][kind]) if name == "open" else count


def least(name: str, kind: str) -> int:
    """The smallest real count `bound:<name>` stands for on a corpus text (every vocabulary for `open`)."""
    if name == "claude":
        return legacy_claude()(CORPUS[kind])
    counts = [len(load_vocabulary(v)(CORPUS[kind])) for v in VOCABULARIES]
    return min(legacy_claude()(CORPUS[kind]), *counts, PINNED["gemma-4"][kind], PINNED["llama-spm"][kind])


@functools.cache
def bound(name: str) -> int:
    return Tokenizers().get(TokenizerSpec("bound", name))  # type: ignore[return-value]


class TestBounds:
    def test_every_bound_has_its_reference(self):
        assert set(REFERENCES) == set(BOUNDS)

    @pytest.mark.parametrize("name", sorted(BOUNDS))
    def test_never_under_on_any_corpus_text(self, name):
        under = {k: (bound(name).count(t), real(name, k)) for k, t in CORPUS.items()}
        under = {k: v for k, v in under.items() if v[0] < v[1]}
        assert not under, f"bound:{name} (bound, real) under on {under}"

    @pytest.mark.parametrize("name", sorted(BOUNDS))
    @pytest.mark.parametrize("kind", sorted(set(PROSE) - CJK_PROSE))
    def test_prose_loses_at_most_a_fifth_of_the_window(self, name, kind):
        assert real(name, kind) / bound(name).count(CORPUS[kind]) >= 0.8

    @pytest.mark.parametrize("name", sorted(BOUNDS))
    def test_its_worst_ratio_holds_on_every_corpus_text(self, name):
        """The stated worst ratio is a true lower bound on the corpus: the provider's count is asked
        between count / ratio and count (proxy.core.counting.edge), never where the request surely overflows."""
        tokenizer = bound(name)
        assert tokenizer.bound_ratio == BOUNDS[name].worst_ratio
        lowest = {k: least(name, k) for k in CORPUS}
        over = {k: tokenizer.count(t) / lowest[k] for k, t in CORPUS.items() if tokenizer.count(t) > lowest[k] * tokenizer.bound_ratio}
        assert not over

    @pytest.mark.parametrize("name", sorted(BOUNDS))
    def test_counts_many_texts_as_it_counts_each(self, name):
        texts = [CORPUS[k] for k in sorted(CORPUS)]
        assert bound(name).count_many(texts) == [bound(name).count(t) for t in texts]

    def test_an_unknown_bound_is_refused(self):
        with pytest.raises(TokenizerUnavailable, match="unknown bound"):
            Tokenizers().check(TokenizerSpec("bound", "nope"))


class TestClassTerms:
    def test_each_class_adds_its_own_term(self):
        terms = BoundTerms(multiplier=1.0, digit=1.0, newline=2.0, run=3.0, thai=4.0, arabic=5.0, other=6.0)
        assert class_terms("12", terms) == 2.0
        assert class_terms("a\nb", terms) == 2.0
        assert class_terms("a   b", terms) == 6.0  # two spaces beyond a run's first
        assert class_terms("ไท", terms) == 8.0
        assert class_terms("عر", terms) == 10.0
        assert class_terms("é😀", terms) == 12.0
        assert class_terms("中文", terms) == 0.0  # covered by the multiplier

    def test_a_long_text_is_measured_in_windows_and_stays_an_upper_bound(self):
        """One `run` term per window cut makes up for a run of spaces a cut splits."""
        terms = BoundTerms(multiplier=1.0, digit=1.0, run=1.0)
        text = "a1  " * 100_000  # 100,000 digits and 100,000 runs of two spaces: 200,000 in terms
        cuts = (len(text) - 1) // TERMS_WINDOW
        assert 200_000 <= class_terms(text, terms) <= 200_000 + cuts
        spaces = " " * 300_000  # one run: 299,999, cut into windows
        assert 299_999 <= class_terms(spaces, terms) <= 299_999 + (len(spaces) - 1) // TERMS_WINDOW

    def test_the_bound_is_the_scaled_base_plus_the_terms_rounded_up(self):
        tokenizer = BoundTokenizer("base", lambda text: 10, BoundTerms(multiplier=1.25, digit=0.5), "t")
        assert tokenizer.count("1 2 3") == 14  # 12.5 + 1.5
        assert tokenizer.count("") == 0 and not tokenizer.exact
        assert tokenizer.name == "base+bound:t"


class TestVocabulariesThatShipInNoPackage:
    """Gemma 3n's vocabulary, Gemini versions no SDK maps yet and Llama 2's ship in no installed package; llama.cpp's
    vocabulary GGUFs of Gemma 4 and Llama 2 reproduce their 46 test vectors each when read with the
    `tokenizers` library, and their counts of the corpus are pinned in tests/data/families/gguf_counts.json
    (tests/data/families/make_gguf_counts.py)."""

    PINNED = PINNED

    def test_the_pinned_counts_cover_the_corpus_and_were_checked_against_llama_cpps_vectors(self):
        assert self.PINNED["vectors_checked"] == {"gemma-4": 46, "llama-spm": 46}
        assert set(self.PINNED["gemma-4"]) == set(self.PINNED["llama-spm"]) == set(CORPUS)

    @pytest.mark.parametrize(
        ("model", "vocabulary"),
        [
            ("gemini-exp-1206", "gemma-4"),
            ("vertex_ai/gemini-9-ultra", "gemma-4"),
            ("google/gemma-3n-E4B-it", "gemma-4"),
            ("meta-llama/Llama-2-7b-chat-hf", "llama-spm"),
            ("codellama-34b-instruct", "llama-spm"),
            ("my-private-model", "gemma-4"),
            ("my-private-model", "llama-spm"),
        ],
    )
    def test_their_bound_is_never_under_their_real_count(self, registry, model, vocabulary):
        tokenizer = Tokenizers().get(registry.profile(model).tokenizer)
        counts = {k: (tokenizer.count(t), self.PINNED[vocabulary][k]) for k, t in CORPUS.items()}
        assert not {k: v for k, v in counts.items() if v[0] < v[1]}

    @pytest.mark.parametrize(("model", "vocabulary"), [("gemini-exp-1206", "gemma-4"), ("llama-2-13b-chat", "llama-spm")])
    def test_english_prose_loses_at_most_a_fifth_of_the_window(self, registry, model, vocabulary):
        tokenizer = Tokenizers().get(registry.profile(model).tokenizer)
        assert self.PINNED[vocabulary]["prose_english"] / tokenizer.count(CORPUS["prose_english"]) >= 0.8


class TestConfiguredBounds:
    def test_parse_names_a_vocabulary_or_a_bound(self):
        assert TokenizerSpec.parse("vocab:llama3") == TokenizerSpec("vocab", "llama3")
        assert TokenizerSpec.parse("bound:claude*1.2") == TokenizerSpec("bound", "claude", 1.2)

    def test_a_multiplier_scales_every_term_of_the_bound(self):
        scaled = Tokenizers().get(TokenizerSpec("bound", "open", 2.0))
        text = CORPUS["csv"]
        assert scaled.name == "cl100k_base+bound:openx2"
        assert bound("open").count(text) * 2 - 1 <= scaled.count(text) <= bound("open").count(text) * 2
