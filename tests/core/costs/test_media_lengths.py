"""Lengths and page counts read from media files' own structure (`audio_lengths`, `video_lengths`,
`pdf_pages`), on files real encoders wrote (tests/adversarial/media_files.py), and what the
readers do with the same files damaged: never an exception, never an unbounded answer."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from proxy.core.costs.media_lengths import audio_seconds, video_seconds
from proxy.core.costs.pdf_pages import PAGES_MOST, PdfPages, pdf_pages
from tests.adversarial.media_files import audio, pdf, video, with_junk_before_format


class TestAudioSeconds:
    @pytest.mark.parametrize(
        ("container", "codec", "rate"),
        [
            ("wav", "pcm_s16le", 16_000),
            ("mp3", "libmp3lame", 16_000),
            ("adts", "aac", 16_000),
            ("flac", "flac", 16_000),
            ("ogg", "libopus", 48_000),
        ],
    )
    def test_a_real_file_reads_its_length(self, container, codec, rate):
        seconds, proven = audio_seconds(audio(container, codec, 7, rate))
        assert proven and 7 <= seconds < 7.2

    def test_a_wav_chunk_walk_skips_what_comes_before_the_format(self):
        wav = audio("wav", "pcm_s16le", 5)
        assert audio_seconds(with_junk_before_format(wav)) == audio_seconds(wav)
        assert 5 <= audio_seconds(wav)[0] < 5.2

    def test_an_unknown_format_is_not_proven(self):
        assert audio_seconds(b"\x00" * 1000) == (0.0, False)


class TestVideoSeconds:
    @pytest.mark.parametrize(
        ("container", "codec", "sound"),
        [("mp4", "libx264", "aac"), ("mov", "mpeg4", None), ("webm", "libvpx", "libopus"), ("matroska", "mpeg4", None)],
    )
    def test_a_real_file_reads_its_length(self, container, codec, sound):
        seconds, proven = video_seconds(video(container, codec, 9, sound))
        assert proven and 9 <= seconds < 9.2

    def test_a_fragmented_mp4_reads_its_fragments(self):
        import io

        import av

        out = io.BytesIO()
        with av.open(out, "w", format="mp4", options={"movflags": "frag_keyframe+empty_moov"}) as muxer:
            stream = muxer.add_stream("mpeg4", rate=1)
            stream.width, stream.height, stream.pix_fmt = 64, 48, "yuv420p"
            for second in range(12):
                frame = av.VideoFrame(64, 48, "yuv420p")
                frame.pts = second
                for packet in stream.encode(frame):
                    muxer.mux(packet)
            for packet in stream.encode():
                muxer.mux(packet)
        seconds, proven = video_seconds(out.getvalue())
        assert proven and seconds >= 11


class TestPdfPages:
    @pytest.mark.parametrize("object_streams", [True, False])
    def test_a_real_file_reads_its_page_tree(self, object_streams):
        assert pdf_pages(pdf(37, object_streams), 1 << 20).pages == 37

    def test_a_page_listed_many_times_counts_each_time_whatever_the_count_says(self):
        """One page object listed 1,000 times in `/Kids` (a reader shows 1,000 pages), its root's
        `/Count` saying 1: a 6 KB file of 1,000 pages."""
        counted = pdf_pages(listed_pages(1000, count=1), 1 << 20)
        assert counted == PdfPages(1000, True)

    def test_a_count_above_the_leaves_is_taken(self):
        assert pdf_pages(listed_pages(3, count=700), 1 << 20) == PdfPages(700, True)

    def test_a_tree_in_its_own_ancestry_is_bounded_by_the_most_pages(self):
        cyclic = listed_pages(3, count=3).replace(b"/Kids [3 0 R", b"/Kids [2 0 R 3 0 R")
        assert pdf_pages(cyclic, 1 << 20) == PdfPages(PAGES_MOST, False)

    def test_objects_that_overlap_are_read_within_a_budget_and_bounded(self):
        """An unclosed string holding `1 0 obj (` sixty thousand times: read once, not from each."""
        counted = pdf_pages(b"%PDF-1.4\n" + b"1 0 obj (" * 60_000, 1 << 20)
        assert counted.pages == PAGES_MOST and not counted.proven

    def test_a_tree_that_cannot_be_walked_is_bounded_by_its_objects(self):
        raw = b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n2 0 obj << /Type /Page >> endobj\n3 0 obj 7 endobj\n"
        counted = pdf_pages(raw, 1 << 20)
        assert counted.pages == 3 and not counted.proven


def listed_pages(listed: int, count: int) -> bytes:
    """A PDF whose page tree lists one page object `listed` times and states `/Count count`."""
    kids = b" ".join(b"3 0 R" for _ in range(listed))
    return (
        b"%PDF-1.7\n1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj\n"
        b"2 0 obj << /Type /Pages /Kids [" + kids + b"] /Count " + str(count).encode() + b" >> endobj\n"
        b"3 0 obj << /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] >> endobj\n"
        b"trailer << /Root 1 0 R /Size 4 >>\n%%EOF\n"
    )


def damaged(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        at = rng.randrange(len(out) or 1)
        choice = rng.random()
        if choice < 0.5 and out:
            out[at] = rng.randrange(256)
        elif choice < 0.7:
            del out[at : at + rng.randint(1, 50)]
        elif choice < 0.85:
            out[at:at] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        else:
            del out[at:]
    return bytes(out)


class TestDamagedFiles:
    @pytest.mark.parametrize(
        ("read", "made"),
        [
            (lambda raw: audio_seconds(raw)[0], lambda: audio("mp3", "libmp3lame", 2)),
            (lambda raw: audio_seconds(raw)[0], lambda: audio("ogg", "libopus", 2, 48_000)),
            (lambda raw: audio_seconds(raw)[0], lambda: audio("adts", "aac", 2)),
            (lambda raw: audio_seconds(raw)[0], lambda: audio("wav", "pcm_s16le", 2)),
            (lambda raw: video_seconds(raw)[0], lambda: video("mp4", "libx264", 4, "aac")),
            (lambda raw: video_seconds(raw)[0], lambda: video("webm", "libvpx", 3, "libopus")),
            (lambda raw: pdf_pages(raw, 1 << 20).pages, lambda: pdf(3, True)),
        ],
    )
    def test_a_damaged_file_never_raises(self, read: Callable[[bytes], float], made: Callable[[], bytes]):
        rng, original = random.Random(7), made()
        for _ in range(400):
            assert read(damaged(original, rng)) >= 0
