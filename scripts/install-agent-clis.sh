#!/usr/bin/env bash
# Installs the agent CLIs that tests/compat/test_agent_clis.py drives through the guard, Claude Code
# and Codex CLI, from the npm registry, pinned, into ~/.cache/context-guard/npm-<versions>/ (about
# 660 MB: both ship a native binary). The pins are the newest releases that declare support for
# Node 20 (`engines`: Claude Code 2.1.198 and later ask for Node 22). Idempotent: an installed
# directory is left alone and the script returns at once. Prints the directory's bin folder on its
# last line. Nothing here runs the CLIs; the tests run them offline against the guard on loopback.
set -euo pipefail

CLAUDE_CODE_VERSION="${CLAUDE_CODE_VERSION:-2.1.197}"
CODEX_VERSION="${CODEX_VERSION:-0.171.0}"
CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/context-guard"
TARGET="$CACHE_DIR/npm-claude-$CLAUDE_CODE_VERSION-codex-$CODEX_VERSION"

if [ -f "$TARGET/.complete" ]; then
    echo "$TARGET/node_modules/.bin"
    exit 0
fi
command -v npm >/dev/null || { echo "npm is needed to install the agent CLIs (apt-get install nodejs npm)" >&2; exit 1; }

mkdir -p "$CACHE_DIR"
rm -rf "$TARGET.partial" && mkdir -p "$TARGET.partial"
echo "installing @anthropic-ai/claude-code@$CLAUDE_CODE_VERSION and @openai/codex@$CODEX_VERSION from npm" >&2
# --ignore-scripts is not used: Claude Code's postinstall links its platform binary.
npm install --prefix "$TARGET.partial" --no-audit --no-fund --loglevel=error \
    "@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION" "@openai/codex@$CODEX_VERSION" >&2
"$TARGET.partial/node_modules/.bin/claude" --version >&2
"$TARGET.partial/node_modules/.bin/codex" --version >&2
touch "$TARGET.partial/.complete"
rm -rf "$TARGET" && mv "$TARGET.partial" "$TARGET"
echo "$TARGET/node_modules/.bin"
