"""The page of recent decisions: `GET /context-guard/recent` (HTML) and `/context-guard/recent.json`.

An operator asks "what did the guard just do to my requests?" without reading logs. This module
serves the answer kept by `proxy.server.observation.recent`: a server-rendered page (no script, a few lines of
inline CSS) with a filter by request id, model and outcome, and the same rows as JSON. With
several workers, every worker's rows, each saying whose it is (`proxy.server.observation.peers`).

Everything a client chose (model names, request ids) is escaped. Who may read it: with
`page.admin_key_env` set, whoever presents that key; else, with `server.client_keys`, whoever
presents a client key; with no key configured at all, loopback clients only. With `page.enabled`
false both paths answer 404.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import html
import ipaddress
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from proxy.errors import HTTPRefusal, PathNotFound, Unauthorized
from proxy.server.edge.credentials import presented_keys as client_keys_presented
from proxy.server.observation.recent import (
    GATHER,
    KNOWN_OUTCOMES,
    RECENT,
    Decision,
    PageQuery,
    RecentDecisions,
    iso_time,
)
from proxy.server.observation.record import ANSWERED_LOCALLY
from proxy.server.request.gateway import GATEWAY

PAGE_PATH = "/context-guard/recent"  # routed by proxy.server.edge.local_paths
JSON_PATH = "/context-guard/recent.json"


async def recent_page(request: web.Request) -> web.Response:
    recent, query = await _readable(request), PageQuery.parse(request.query)
    body = await render_page_sliced(recent, query)
    return web.Response(text=body, content_type="text/html", charset="utf-8", headers=_PAGE_HEADERS)


async def recent_json(request: web.Request) -> web.Response:
    recent, query = await _readable(request), PageQuery.parse(request.query)
    text = await json_text_sliced(recent, query)
    return web.Response(text=text, content_type="application/json", headers={"Cache-Control": "no-store"})


async def _readable(request: web.Request) -> RecentDecisions:
    """A snapshot of the decisions to show: this process's, or, with several workers, everyone's."""
    snapshot = _authorised(request).snapshot()
    gather = request.app.get(GATHER)
    return snapshot if gather is None else await gather(snapshot)


# The page is rendered on the loop in slices of rows, handing the loop back after each
# `SLICE_SECONDS`: building strings is work for the interpreter, which a thread would only contend
# for (the GIL). A row is bounded (proxy.server.observation.recent: MAX_NAME_CHARS, MAX_NOTES), so a slice
# overruns by at most one row.
SLICE_SECONDS = 0.002


async def _in_slices(rows: list[Decision], render: Callable[[Decision], str]) -> list[str]:
    pieces: list[str] = []
    since = time.perf_counter()
    for row in rows:
        pieces.append(render(row))
        if time.perf_counter() - since > SLICE_SECONDS:
            await asyncio.sleep(0)
            since = time.perf_counter()
    return pieces


async def render_page_sliced(recent: RecentDecisions, query: PageQuery) -> str:
    """`render_page`, a slice of rows at a time (`recent` is a snapshot: rows added meanwhile do not show)."""
    rows = recent.rows(query)
    return render_page(recent, query, rows, "".join(await _in_slices(rows, _decision_row)))


async def json_text_sliced(recent: RecentDecisions, query: PageQuery) -> str:
    """`recent.to_dict(query)` as JSON text, a slice of rows at a time."""
    pieces = await _in_slices(recent.rows(query), lambda d: json.dumps(d.to_dict()))
    head = json.dumps(recent.to_dict(query, with_rows=False))  # a non-empty object: `rows` goes last
    return head[:-1] + ', "rows": [' + ", ".join(pieces) + "]}"


_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def _authorised(request: web.Request) -> RecentDecisions:
    """The buffer, for a reader the settings allow; else 404 (off), 401 (no or wrong key) or 403."""
    settings = request.app[GATEWAY].settings
    if not settings.page.enabled:
        raise PathNotFound(f"context-guard does not serve {request.path} (page.enabled is false)")
    if settings.page.admin_key_env:
        admin_key = os.environ.get(settings.page.admin_key_env, "")
        keys: tuple[str, ...] = (admin_key,) if admin_key else ()
        if not keys:
            raise HTTPRefusal(
                f"the page's admin key is not set (page.admin_key_env names {settings.page.admin_key_env})", 403
            )
    else:
        keys = settings.server.client_keys
    if keys:
        given = [key.encode("utf-8", "surrogateescape") for key in presented_keys(request)]
        if not any(hmac.compare_digest(g, key.encode()) for g in given for key in keys):
            raise Unauthorized(
                "this page needs a key: Authorization: Bearer <key>, or the key as a browser's password",
                headers={"WWW-Authenticate": 'Basic realm="context-guard", charset="UTF-8"'},
            )
    elif not _loopback(request.remote):
        raise HTTPRefusal("with no key configured, this page is served to loopback clients only", 403)
    return request.app[RECENT]


def presented_keys(request: web.Request) -> list[str]:
    """The keys a request presents as a client would, and a Basic password (what a browser sends
    after asking for one; the user name is ignored)."""
    keys = client_keys_presented(request.headers)
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "basic" and value.strip():
        with contextlib.suppress(binascii.Error, UnicodeDecodeError):  # not Basic as browsers send it: no key
            keys.append(base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[2])
    return keys


def _loopback(remote: str | None) -> bool:
    try:
        return remote is not None and ipaddress.ip_address(remote.split("%")[0]).is_loopback
    except ValueError:
        return False


# ---- rendering: every value that reaches the HTML goes through `_e` ----


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _n(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def render_page(
    recent: RecentDecisions, query: PageQuery, rows: list[Decision] | None = None, rendered: str | None = None
) -> str:
    """The page; `rows` and their `rendered` HTML when they were made beforehand (in slices)."""
    rows = recent.rows(query) if rows is None else rows
    outcomes = sorted({*KNOWN_OUTCOMES, *(d.outcome for d in recent.decisions)})
    shown = f"{len(rows)} of {len(recent.decisions)}" if query.active else str(len(rows))
    parts = [
        _HEAD,
        "<header><h1>context-guard · recent decisions</h1>",
        f"<p class=sub>{_e(shown)} decisions shown, newest first; the last {recent.size:,} are kept. "
        f'No message content is ever shown. <a href="{JSON_PATH}">JSON</a></p>{_workers(recent.workers)}</header>',
        _filter_form(query, outcomes),
        _decisions_table(rows, rendered),
        _corrections_table(recent),
        _calibration_table(recent.calibration),
        "</body></html>",
    ]
    return "\n".join(parts)


def _workers(workers: Mapping[str, Any] | None) -> str:
    """Whose decisions these are, when several processes serve the port."""
    if workers is None:
        return ""
    count, missing = workers["count"], workers["missing"]
    said = f"From all {count} workers" if not missing else f"From {count - len(missing)} of {count} workers"
    if missing:
        said += f"; worker {', '.join(map(str, missing))} did not answer in time, so its decisions are missing"
    return f"<p class=sub id=workers>{_e(said)} (this page from worker {workers['served_by']}).</p>"


def _filter_form(query: PageQuery, outcomes: Iterable[str]) -> str:
    options = ['<option value="">any outcome</option>'] + [
        f'<option value="{_e(o)}"{" selected" if o == query.outcome else ""}>{_e(o)}</option>' for o in outcomes
    ]
    return (
        f'<form method="get" action="{PAGE_PATH}" class=filter>'
        f'<label>request id <input name="request_id" value="{_e(query.request_id)}" size=26></label>'
        f'<label>model <input name="model" value="{_e(query.model)}" size=22></label>'
        f'<label>outcome <select name="outcome">{"".join(options)}</select></label>'
        '<button type="submit">Filter</button>'
        + (f' <a href="{PAGE_PATH}">clear</a>' if query.active else "")
        + "</form>"
    )


def _decisions_table(rows: list[Decision], rendered: str | None = None) -> str:
    if not rows:
        return '<p class=empty id="no-decisions">No decisions match.</p>'
    head = (
        "<table id=decisions><thead><tr><th>time (UTC)</th><th>request id</th><th>model</th><th>outcome</th>"
        "<th>status</th><th>tokens before → after / budget<div class=legend><i class=lb></i>before "
        "<i class=la></i>after <i class=lg></i>budget</div></th><th>removed</th></tr></thead><tbody>"
    )
    body = rendered if rendered is not None else "".join(_decision_row(d) for d in rows)
    return head + body + "</tbody></table>"


def _decision_row(d: Decision) -> str:
    model = _e(d.model or "—")
    if d.served_model:
        model += f"<div class=minor>served as {_e(d.served_model)}</div>"
    if d.upstream:
        model += f"<div class=minor>via {_e(d.upstream)}</div>"
    if d.worker is not None:
        model += f"<div class=minor>worker {d.worker}</div>"
    chips = [_e(n) for n in d.notes]
    if d.stream:
        chips.insert(0, "streamed")
    if d.error and d.outcome not in ("trimmed", "unchanged"):
        chips.insert(0, _e(d.error))
    if d.corrected_window is not None:
        chips.append(f"corrected window {d.corrected_window:,}")
    notes = f"<div>{''.join(f'<span class=note>{chip}</span>' for chip in chips)}</div>" if chips else ""
    filter_link = f"{PAGE_PATH}?{urlencode({'request_id': d.request_id})}"
    return (
        f'<tr class="decision outcome-{_e(d.outcome)}" data-request-id="{_e(d.request_id)}">'
        f'<td class=time><time datetime="{iso_time(d.at)}">{_e(iso_time(d.at)[:19].replace("T", " "))}</time></td>'
        f'<td class=rid><a href="{_e(filter_link)}">{_e(d.request_id)}</a></td>'
        f"<td class=model>{model}</td>"
        f'<td class=outcome><span class="badge {_e(d.outcome)}">{_e(d.outcome)}</span>{notes}</td>'
        f"<td class=num>{d.status}</td>"
        f"<td class=tokens>{_bar(d)}</td>"
        f"<td class=removed>{_removed(d)}</td></tr>"
    )


def _bar(d: Decision) -> str:
    """Before (pale), after (solid) and the budget (a line), on one scale: the larger of before and budget."""
    if d.tokens_counted is not None:
        return f"<div class=figures>{_n(d.tokens_counted)} tokens counted</div>"
    if d.tokens_before is None or d.tokens_after is None or d.budget is None:
        return "<span class=minor>not counted</span>"
    scale = max(d.tokens_before, d.budget, 1)

    def pct(value: int) -> str:
        return f"{min(100.0, 100.0 * value / scale):.1f}%"

    over = " over" if d.tokens_after > d.budget else ""
    label = f"{_n(d.tokens_before)} → {_n(d.tokens_after)} / {_n(d.budget)}"
    return (
        f'<div class="bar{over}" role="img" aria-label="{_e(label)} tokens">'
        f'<span class=before style="width:{pct(d.tokens_before)}"></span>'
        f'<span class=after style="width:{pct(d.tokens_after)}"></span>'
        f'<span class=budget style="left:{pct(d.budget)}"></span></div>'
        f"<div class=figures>{_e(label)}</div>"
    )


# What each kind of removal did to the request, in the words the page uses (docs/operations.md).
KIND_WORDS = {
    "dropped": "removed whole",
    "cleared": "a placeholder left in its place",
    "truncated": "shortened in place",
    "image_dropped": "image replaced by a marker",
    "max_tokens_clamped": "max_tokens lowered",
}


def _removed(d: Decision) -> str:
    if d.outcome == ANSWERED_LOCALLY:
        return "<span class=minor>nothing: answered by the guard, not forwarded</span>"
    if not d.removed:
        return "<span class=minor>nothing</span>"
    total = f"<div class=total>{d.removed_count:,} removed, {d.removed_tokens:,} tokens</div>"
    return total + "<ul>" + "".join(_run(run) for run in d.removed) + "</ul>"


def _run(run: Mapping[str, Any]) -> str:
    """One run of removals: where, how many of which kind and what that did, the tokens, the
    strategy; then what it held (messages by role, tool names), never what they said."""
    kind = str(run.get("kind", ""))
    how = f"{run['count']} {kind}" if "count" in run else f"{run.get('role') or ''} {kind}".strip()
    if kind in KIND_WORDS:
        how += f" ({KIND_WORDS[kind]})"
    tokens = f"{int(run.get('tokens', 0)):,} tokens"
    if not how:  # the note that sums the runs not shown
        return f"<li>{_e(run.get('what', ''))}, {_e(tokens)}</li>"
    strategy = f" <span class=strategy>{_e(run['strategy'])}</span>" if run.get("strategy") else ""
    held = []
    roles = run.get("roles") or {}
    if len(roles) > 1 or "count" in run:
        held.append(", ".join(f"{count} {role}" for role, count in roles.items()) + " messages")
    if tools := run.get("tools"):
        named = ", ".join(f"{tool} ({count})" if count > 1 else str(tool) for tool, count in tools.items())
        more = f" and {run['tools_not_shown']} more" if run.get("tools_not_shown") else ""
        held.append(f"tools: {named}{more}")
    inside = f"<div class=held>held {_e('; '.join(held))}</div>" if held else ""
    return f"<li>{_e(run.get('what', ''))}: {_e(how)}, {_e(tokens)}{strategy}{inside}</li>"


def _corrections_table(recent: RecentDecisions) -> str:
    head = "<h2>Learned corrections</h2>"
    if not recent.corrections:
        return head + '<p class=empty id="no-corrections">No upstream has corrected a window yet.</p>'
    rows = "".join(
        f"<tr><td>{_e(upstream)}</td><td>{_e(model)}</td><td class=num>{_n(c.get('corrected_window'))}</td>"
        f"<td class=num>{_e(c.get('factor'))}</td><td class=num>{_n(c.get('provider_limit'))}</td>"
        f"<td>{_e(c.get('provider'))}</td><td>{_e(c.get('source'))}</td>"
        f"<td>{_e(iso_time(c['at'])[:19].replace('T', ' '))}</td></tr>"
        for (upstream, model), c in reversed(recent.corrections.items())
    )
    return (
        head + "<table id=corrections><thead><tr><th>upstream</th><th>model</th><th>window</th><th>factor</th>"
        "<th>stated limit</th><th>provider</th><th>seen as</th><th>last seen (UTC)</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )


def _calibration_table(calibration: Mapping[str, float]) -> str:
    if not calibration:
        return ""
    rows = "".join(
        f"<tr><td>{_e(model)}</td><td class=num>{ratio:.3f}</td></tr>" for model, ratio in sorted(calibration.items())
    )
    return (
        "<h2>Calibration</h2><table id=calibration><thead><tr><th>model</th><th>provider / our count</th></tr>"
        f"</thead><tbody>{rows}</tbody></table>"
    )


_HEAD = """<!doctype html><html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>context-guard · recent decisions</title>
<style>
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:20px 28px;color:#1d2430;background:#f6f7f9}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:26px 0 8px}
.sub{color:#5a6473;margin:0 0 14px}a{color:#2457c5}
.filter{display:flex;gap:14px;align-items:end;flex-wrap:wrap;background:#fff;border:1px solid #dde1e7;
border-radius:8px;padding:10px 14px;margin-bottom:14px}
.filter label{display:flex;flex-direction:column;font-size:12px;color:#5a6473;gap:2px}
.filter input,.filter select{font:inherit;padding:4px 6px;border:1px solid #c3c9d2;border-radius:4px}
.filter button{font:inherit;padding:5px 14px;border:0;border-radius:4px;background:#2457c5;color:#fff}
table{border-collapse:collapse;width:100%;background:#fff;border:1px solid #dde1e7;border-radius:8px}
th,td{text-align:left;padding:7px 10px;border-bottom:1px solid #eceef2;vertical-align:top}
th{font-size:12px;color:#5a6473;font-weight:600;background:#fafbfc}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.time,td.rid{white-space:nowrap;font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
.minor{color:#7a8391;font-size:12px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;background:#e6e9ee}
.badge.trimmed{background:#fdf0d2;color:#8a5a00}.badge.rejected,.badge.failed{background:#fbe0e0;color:#a11d1d}
.badge.unchanged,.badge.forwarded{background:#dff3e4;color:#1d6b34}
.badge.answered_locally{background:#e3ecfb;color:#1f4f9e}.badge.refused{background:#fbe9d6;color:#8a4300}
.held{color:#5a6473}
.badge.forwarded_over_budget{background:#fbe0e0;color:#a11d1d}
.note{display:inline-block;margin:3px 4px 0 0;padding:0 6px;border-radius:8px;font-size:11px;
background:#eef0f4;color:#4a5361}
td.tokens{min-width:240px}td.model{min-width:120px}td.outcome{max-width:190px}
.bar{position:relative;height:12px;background:#eef0f4;border-radius:3px;overflow:hidden;margin-top:3px}
.bar span{position:absolute;top:0;bottom:0;left:0}.bar .before{background:#c9d6f2}.bar .after{background:#2f6fdf}
.bar.over .after{background:#d64545}.bar .after{min-width:2px}
.bar .budget{width:2px;margin-left:-2px;background:#1d2430}
.legend{font-weight:400;margin-top:2px}.legend i{display:inline-block;width:10px;height:8px;margin:0 3px 0 6px}
.legend .lb{background:#c9d6f2}.legend .la{background:#2f6fdf}.legend .lg{width:2px;background:#1d2430}
.figures{font-size:12px;color:#4a5361;font-variant-numeric:tabular-nums;margin-top:2px}
td.removed ul{margin:2px 0 0;padding-left:16px;font-size:12px}.total{font-size:12px;font-weight:600}
.strategy{font-family:ui-monospace,Menlo,Consolas,monospace;color:#5a6473}
.empty{color:#5a6473;background:#fff;border:1px dashed #c3c9d2;border-radius:8px;padding:14px}
</style></head><body>"""
