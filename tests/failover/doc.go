// Package failover runs two `loops serve` gateways on one throwaway PostgreSQL database and
// one checkpoint folder, behind a real HAProxy front, and kills the leader with SIGKILL:
// the end-to-end check of docs/two-gateways.md (make test-failover, with a tinker SDK script
// training through the front) and the harness of bench/failover (failover times over many
// kills).
//
// TestPausedLeaderIsFenced (no build tag: it runs with the Go tests) is the fenced-write
// check of issue 23: a leader process, stopped with SIGSTOP past its lease while it commits
// batch after batch, is resumed after the standby took over and wrote; its batch in flight is
// refused (store.ErrFenced) and the records stay the new leader's.
//
// The harness needs the PostgreSQL binaries (see gateway/store/postgres/pgtest), haproxy on
// PATH (Debian's haproxy package; .ci/run installs it) and, for the tinker script, the
// cached tinker venv (scripts/pyenv.sh).
package failover
