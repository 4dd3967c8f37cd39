"""Google's own paths, read once: which API version and project a path names, whether it asks a
model to generate, and whether it is one of the few the guard lets through uncounted.

Google's APIs reach far beyond the paths the guard counts (`:generateContent`,
`:streamGenerateContent`, `interactions`): batch generation, tuned models, video generation,
prediction, Vertex AI's OpenAI-compatible endpoint. A pass-through that forwarded whatever it did
not count would put all of that on the operator's credential uncounted. So, to a Google upstream,
pass-through is an allow-list:

    cachedContents                     create, get, list, update, delete (a cache's content is
                                       counted where a request names it)
    files                              list, get, delete, upload (`/upload/{version}/files`)
    models                             list and get (`models`, `publishers/google/models`)
    interactions/{id}                  get, delete, and `.../cancel`: reading back what was stored

each under any of Google's version prefixes, and for Vertex AI under a project and location.
Every other path goes nowhere; and a path whose method generates (`:generateContent`,
`:batchGenerateContent`, `:predict`, ... in any case) that no adapter counts is refused whatever
the upstream: `generation_method`.
"""

from __future__ import annotations

from dataclasses import dataclass

VERSIONS = frozenset({"v1", "v1beta", "v1beta1", "v1alpha", "v1beta2", "v1beta3"})
# Versions only Google's APIs use: a path under one of these is Google's whatever it names.
GOOGLE_VERSIONS = VERSIONS - {"v1"}
# Resources only Google's APIs have under `/v1` (OpenAI's `/v1/models` and `/v1/files` are not among them).
GOOGLE_RESOURCES = frozenset(
    {"cachedContents", "interactions", "tunedModels", "corpora", "ragStores", "fileSearchStores", "batches",
     "projects", "publishers", "operations", "generatedFiles", "dynamic", "permissions", "agents"}
)  # fmt: skip
# Methods that run a model, lower-cased: the Gemini API's and Vertex AI's (`:rawPredict` for
# publishers' models, `:predictLongRunning` for video, `:streamingPredict` ...).
GENERATING = frozenset(
    {
        "generatecontent", "streamgeneratecontent", "batchgeneratecontent", "asyncbatchgeneratecontent",
        "generateanswer", "generatetext", "generatemessage", "predict", "predictlongrunning", "rawpredict",
        "streamrawpredict", "streamingpredict", "serverstreamingpredict", "directpredict", "directrawpredict",
        "streamingrawpredict", "chat", "completions", "invoke", "streaminvoke", "bidigeneratecontent",
        "counttokens", "computetokens", "generatevideos", "generateimages", "editimage", "upscaleimage",
    }
)  # fmt: skip
_LISTED = frozenset({"GET", "HEAD"})


@dataclass(frozen=True, slots=True)
class GooglePath:
    """A path read as Google writes them: `/{version}[/projects/{p}/locations/{l}]/{resource...}`
    (`upload` set for `/upload/{version}/...`)."""

    version: str
    project: str | None
    location: str | None
    resource: tuple[str, ...]
    upload: bool = False

    @property
    def google_only(self) -> bool:
        """Whether no API but Google's has this path (so it is Google's whichever upstream it went to)."""
        first = self.resource[0] if self.resource else ""
        return self.upload or self.version in GOOGLE_VERSIONS or first in GOOGLE_RESOURCES or self.project is not None


def google_path(segments: tuple[str, ...]) -> GooglePath | None:
    """`segments` read as a Google path; None when they do not open with one of Google's versions."""
    upload = bool(segments) and segments[0] == "upload"
    if upload:
        segments = segments[1:]
    if not segments or segments[0] not in VERSIONS:
        return None
    version, rest = segments[0], segments[1:]
    if len(rest) >= 4 and rest[0] == "projects" and rest[2] == "locations":
        return GooglePath(version, rest[1], rest[3], rest[4:], upload)
    if len(rest) >= 2 and rest[0] == "projects":
        return GooglePath(version, rest[1], None, rest[2:], upload)
    return GooglePath(version, None, None, rest, upload)


def generation_method(segments: tuple[str, ...]) -> str | None:
    """The generating method a path names in any segment (`models/x:GenerateContent`), or None."""
    for segment in segments:
        _, colon, method = segment.rpartition(":")
        # Letters only, in any case: `:generateContent `, `:generate_content` are the same method to a lenient server.
        if colon and "".join(c for c in method.lower() if c.isascii() and c.isalpha()) in GENERATING:
            return method
    return None


def passes(path: GooglePath, method: str) -> bool:
    """Whether a Google upstream may be sent `method` on `path` uncounted (the allow-list above)."""
    resource = path.resource
    if not resource or any(":" in segment for segment in resource) or any(s in VERSIONS for s in resource):
        return False
    first, size = resource[0], len(resource)
    if first == "cachedContents":
        return size <= 2
    if first == "files":
        return size <= 2
    if path.upload:
        return False
    if first == "models":
        return method in _LISTED and size <= 2
    if resource[:3] == ("publishers", "google", "models"):
        return method in _LISTED and size <= 4
    if first == "interactions":
        return (size == 2 and method in ("GET", "DELETE")) or (size == 3 and resource[2] == "cancel")
    return False


def is_google_shaped(segments: tuple[str, ...]) -> bool:
    """Whether a refusal on this path is said in Google's error shape: a path only Google's APIs
    have, or one naming a `:method` under one of Google's versions."""
    path = google_path(segments)
    return path is not None and (path.google_only or ":" in segments[-1])
