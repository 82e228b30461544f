#!/usr/bin/env bash
# The jobs sandbox's tests (gateway/jobs: the escape tests and the rest; gateway: a job is
# not an operator) with the gateway-side code running as root and as an unprivileged user
# (nobody, through setpriv), each in the shape it takes there:
#   - root: each job gets a host uid of its own and, where the host has one, a cgroup
#     (cgroup v2, or v1 on a hybrid host);
#   - nobody: jobs run as the gateway's user in an unprivileged user namespace; without a
#     delegated cgroup they run with weak limits (the fixture opts in) and the refusal
#     without it is tested too.
# Run as root (CI) it does both; run as another user, the unprivileged half only.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}

for tool in bwrap python3 setpriv; do
  command -v "$tool" >/dev/null || { echo "test-jobs-sandbox: $tool is missing (.ci/run installs bubblewrap and util-linux)"; exit 1; }
done

work=$(mktemp -d /tmp/loops-jobs-sandbox.XXXXXX)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"
$GO test -c -o "$work/jobs.test" ./gateway/jobs/
$GO test -c -o "$work/gateway.test" ./gateway/
chmod 755 "$work"/*.test

run() { # LABEL PREFIX... : both test binaries, from $work, with a TMPDIR of the user's
  local label=$1; shift
  local tmp="$work/tmp-$label"
  mkdir -p "$tmp/home"
  chown -R "$owner" "$tmp"
  echo "test-jobs-sandbox: gateway/jobs as $label"
  (cd "$work" && "$@" env HOME="$tmp/home" TMPDIR="$tmp" ./jobs.test -test.count=1 -test.timeout=15m)
  echo "test-jobs-sandbox: gateway (jobs through the gateway) as $label"
  (cd "$work" && "$@" env HOME="$tmp/home" TMPDIR="$tmp" ./gateway.test -test.count=1 -test.timeout=5m -test.run '^TestJob')
}

if [ "$(id -u)" -eq 0 ]; then
  owner=root
  run root env
  nobody_uid=$(id -u nobody) nobody_gid=$(id -g nobody)
  owner="$nobody_uid:$nobody_gid"
  as_nobody=(setpriv --reuid="$nobody_uid" --regid="$nobody_gid" --clear-groups)
  # Unprivileged bubblewrap needs user namespaces open to ordinary users.
  if ! "${as_nobody[@]}" bwrap --unshare-user --ro-bind / / true; then
    echo "test-jobs-sandbox: nobody cannot make a user namespace with bwrap here:"
    echo "  kernel.unprivileged_userns_clone=$(cat /proc/sys/kernel/unprivileged_userns_clone 2>/dev/null || echo n/a)" \
      "user.max_user_namespaces=$(cat /proc/sys/user/max_user_namespaces 2>/dev/null || echo n/a)" \
      "apparmor_restrict_unprivileged_userns=$(cat /proc/sys/kernel/apparmor_restrict_unprivileged_userns 2>/dev/null || echo n/a)"
    ls -l "$(command -v bwrap)"
    exit 1
  fi
  run nobody "${as_nobody[@]}"
else
  owner=$(id -u):$(id -g)
  echo "test-jobs-sandbox: not root: the root half is skipped"
  run "$(id -un)" env
fi
