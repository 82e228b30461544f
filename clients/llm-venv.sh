#!/usr/bin/env bash
# clients/llm-venv.sh: prints the path of the cached venv (scripts/pyenv.sh) shared by the
# inference API client tests (clients/openai, clients/anthropic, clients/curl): the official
# openai and anthropic clients, the OpenAI Agents SDK, the tinker SDK (and its transformers),
# jinja2 and jsonschema (structured outputs are validated with it).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exec "$root/scripts/pyenv.sh" loops-llm-clients openai==3.51.0 anthropic==2.10.0 tinker==0.38.0 jinja2==3.1.6 openai-agents==0.24.0 jsonschema==4.26.0
