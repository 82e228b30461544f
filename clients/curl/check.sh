#!/usr/bin/env bash
# clients/curl/check.sh: the inference APIs of a running Loops server (LOOPS_URL,
# LOOPS_API_KEY) driven by curl, streaming included (curl -N reads the server-sent events as
# they come). JSON is read with python3's json module. Checks that the OpenAI chat answer,
# its stream, the Anthropic message and its stream carry the same greedy text, that the
# streams end as their protocols say ([DONE]; message_stop), that count_tokens agrees with
# the usage, and that an unsupported field is a 400 naming it. Exits 1 on any failure.
set -euo pipefail
url=${LOOPS_URL:?}
key=${LOOPS_API_KEY:-tml-clients-test}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

ok() { echo "ok: $*"; }
fail() { echo "FAIL: $*" >&2; exit 1; }
json() { python3 -c "import json,sys; d=json.load(sys.stdin); print($1)"; }

chat='{"model":"loops/tiny","max_tokens":12,"temperature":0,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hello there"}]}'
msg='{"model":"loops/tiny","max_tokens":12,"temperature":0,"system":"Be brief.","messages":[{"role":"user","content":"Hello there"}]}'

# OpenAI, plain and streamed.
curl -sS --fail-with-body -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d "$chat" "$url/oai/api/v1/chat/completions" >"$tmp/chat.json"
want=$(json 'json.dumps(d["choices"][0]["message"]["content"])' <"$tmp/chat.json")
prompt_tokens=$(json 'd["usage"]["prompt_tokens"]' <"$tmp/chat.json")
ok "openai chat: $want"
curl -sS -N --fail-with-body -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d "${chat%\}},\"stream\":true,\"stream_options\":{\"include_usage\":true}}" "$url/oai/api/v1/chat/completions" >"$tmp/chat.sse"
[[ $(grep -c . "$tmp/chat.sse") -gt 0 && $(grep '^data: ' "$tmp/chat.sse" | tail -1) == "data: [DONE]" ]] || fail "openai stream ends with [DONE]"
got=$(grep '^data: {' "$tmp/chat.sse" | sed 's/^data: //' | python3 -c '
import json, sys
text = ""
for line in sys.stdin:
    for ch in json.loads(line)["choices"]:
        text += ch["delta"].get("content") or ""
print(json.dumps(text))')
[[ $got == "$want" ]] || fail "openai stream text $got != $want"
ok "openai stream adds up to the plain answer and ends with [DONE]"

# Anthropic, plain and streamed, with x-api-key.
curl -sS --fail-with-body -H "x-api-key: $key" -H 'anthropic-version: 2023-06-01' -H 'Content-Type: application/json' \
  -d "$msg" "$url/anthropic/api/v1/messages" >"$tmp/msg.json"
got=$(json 'json.dumps(d["content"][0]["text"])' <"$tmp/msg.json")
[[ $got == "$want" ]] || fail "anthropic message $got != openai chat $want"
# Anthropic's input_tokens leave out the prompt tokens read from the prefix cache
# (cache_read_input_tokens; the OpenAI request before it cached this prompt): the two add up
[[ $(json 'd["usage"]["input_tokens"] + d["usage"]["cache_read_input_tokens"]' <"$tmp/msg.json") == "$prompt_tokens" ]] || fail "anthropic input_tokens + cache_read_input_tokens != openai prompt_tokens"
ok "anthropic message equals the openai chat answer"
curl -sS -N --fail-with-body -H "x-api-key: $key" -H 'anthropic-version: 2023-06-01' -H 'Content-Type: application/json' \
  -d "${msg%\}},\"stream\":true}" "$url/anthropic/api/v1/messages" >"$tmp/msg.sse"
events=$(sed -n 's/^event: //p' "$tmp/msg.sse" | uniq | tr '\n' ' ')
[[ $events == "message_start content_block_start ping content_block_delta content_block_stop message_delta message_stop " ]] || fail "anthropic events: $events"
got=$(grep '^data: ' "$tmp/msg.sse" | sed 's/^data: //' | python3 -c '
import json, sys
text = ""
for line in sys.stdin:
    d = json.loads(line)
    if d["type"] == "content_block_delta":
        text += d["delta"]["text"]
print(json.dumps(text))')
[[ $got == "$want" ]] || fail "anthropic stream text $got != $want"
ok "anthropic stream: $events"
n=$(curl -sS --fail-with-body -H "x-api-key: $key" -H 'Content-Type: application/json' \
  -d '{"model":"loops/tiny","system":"Be brief.","messages":[{"role":"user","content":"Hello there"}]}' \
  "$url/anthropic/api/v1/messages/count_tokens" | json 'd["input_tokens"]')
[[ $n == "$prompt_tokens" ]] || fail "count_tokens $n != $prompt_tokens"
ok "count_tokens $n"

# Unsupported fields are 400s naming them, in each protocol's shape.
status=$(curl -sS -o "$tmp/err.json" -w '%{http_code}' -H "x-api-key: $key" -H 'Content-Type: application/json' \
  -d '{"model":"loops/tiny","max_tokens":4,"messages":[{"role":"user","content":"x"}],"thinking":{"type":"enabled","budget_tokens":1024}}' "$url/anthropic/api/v1/messages")
[[ $status == 400 && $(json 'd["type"] + " " + d["error"]["type"]' <"$tmp/err.json") == "error invalid_request_error" ]] || fail "anthropic 400: $status $(cat "$tmp/err.json")"
grep -q thinking "$tmp/err.json" || fail "the anthropic 400 names thinking"
status=$(curl -sS -o "$tmp/err.json" -w '%{http_code}' -H "Authorization: Bearer $key" -H 'Content-Type: application/json' \
  -d '{"model":"loops/tiny","messages":[{"role":"user","content":"x"}],"reasoning_effort":"high"}' "$url/oai/api/v1/chat/completions")
[[ $status == 400 && $(json 'd["error"]["param"]' <"$tmp/err.json") == reasoning_effort ]] || fail "openai 400: $status $(cat "$tmp/err.json")"
ok "unsupported fields are 400s naming them"
echo "curl: all checks passed"
