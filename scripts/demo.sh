#!/usr/bin/env bash
# Runs against the server that `make run` started (127.0.0.1:$PORT, default 6379) and shows
# RL.GCRA admitting a burst, denying, and admitting again after retry_after_ms.
set -euo pipefail
PORT="${PORT:-6379}"
cli() { redis-cli -h 127.0.0.1 -p "$PORT" "$@"; }

if ! cli PING >/dev/null 2>&1; then
    echo "No Redis on 127.0.0.1:$PORT. Start one with \`make run\` in another shell." >&2
    exit 1
fi

key="demo:user:$$"
echo "Limit: burst 3, rate 2 per 1 second (one request every 500 ms after the burst)."
echo "Key: $key"
echo

request() {
    local label="$1"
    local -a r
    mapfile -t r < <(cli RL.GCRA "$key" 3 2 1)
    if [ "${r[0]}" = 1 ]; then verdict="ALLOWED"; else verdict="DENIED "; fi
    printf '%-22s %s  [%s, %s, %s, %s, %s]\n' "$label" "$verdict" "${r[0]}" "${r[1]}" "${r[2]}" "${r[3]}" "${r[4]}"
    printf '%22s   limit=%s remaining=%s retry_after_ms=%s reset_after_ms=%s\n' "" "${r[1]}" "${r[2]}" "${r[3]}" "${r[4]}"
    RETRY_MS="${r[3]}"
    ALLOWED="${r[0]}"
}

echo "Reply fields: [allowed, limit, remaining, retry_after_ms, reset_after_ms]"
echo
for i in 1 2 3 4; do
    request "request $i"
done
echo
if [ "$ALLOWED" = 0 ]; then
    echo "Request 4 was denied: the burst of 3 is used up. retry_after_ms=$RETRY_MS says when the"
    echo "same request will pass (HTTP: 429 with Retry-After: $(( (RETRY_MS + 999) / 1000 )))."
    echo "Waiting ${RETRY_MS} ms ..."
    sleep "$(awk -v ms="$RETRY_MS" 'BEGIN { printf "%.3f", ms / 1000 }')"
    request "retry after wait"
    echo
    if [ "$ALLOWED" = 1 ]; then
        echo "Allowed again: one request's worth of capacity came back after 500 ms."
    else
        echo "Still denied: retry_after_ms=$RETRY_MS (another client may be using this key)."
    fi
fi
echo "TTL of the key (ms): $(cli PTTL "$key") -- it expires exactly when the bucket is full again."
