package gateway

import (
	"archive/tar"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/evals"
	"github.com/loops-dev/loops/gateway/jobs"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// rewardHarness is the entrypoint of a reward eval's job: it loads reward.py, calls its
// reward(prompt, completion, info) on each row of rows.jsonl and prints the rewards as one
// JSON list after the marker given as its argument. Its stdout is the job's log.
const rewardHarness = `import importlib.util, json, math, os, sys
here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("reward", os.path.join(here, "reward.py"))
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
if not callable(getattr(mod, "reward", None)):
    sys.exit("reward.py defines no function reward(prompt, completion, info)")
out = []
with open(os.path.join(here, "rows.jsonl"), encoding="utf-8") as f:
    for i, line in enumerate(f, 1):
        row = json.loads(line)
        r = float(mod.reward(row["prompt"], row["completion"], row.get("info")))
        if not math.isfinite(r):
            sys.exit(f"row {i}: reward {r} is not a finite number")
        out.append(r)
print(sys.argv[1] + json.dumps(out), flush=True)
`

// maxRewardLog bounds the log read back from a reward job.
const maxRewardLog = 1 << 20

// jobRewards runs reward evals' functions as jobs of the workspace (core.RewardRunner): in
// the jobs sandbox (bubblewrap, the workspace's allow_jobs, running-jobs, time and memory
// quotas), listed with its other jobs.
type jobRewards struct{ jobs *jobs.Service }

// Reward runs script on inputs in one job and reads the rewards from its log.
func (r jobRewards) Reward(ctx context.Context, ws, script string, inputs []evals.RewardInput) ([]float64, error) {
	var nonce [8]byte
	_, _ = rand.Read(nonce[:])
	marker := "LOOPS_REWARDS_" + hex.EncodeToString(nonce[:]) + " "
	var rows bytes.Buffer
	for _, in := range inputs {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		rows.Write(b)
		rows.WriteByte('\n')
	}
	archive, err := tarGz(map[string][]byte{"harness.py": []byte(rewardHarness), "reward.py": []byte(script), "rows.jsonl": rows.Bytes()})
	if err != nil {
		return nil, err
	}
	wctx := auth.WithWorkspace(ctx, ws)
	job, err := r.jobs.SubmitJob(wctx, &loopsv1.SubmitJobRequest{Archive: archive, Entrypoint: "harness.py", Args: []string{marker}})
	if err != nil {
		return nil, fmt.Errorf("starting the reward function as a job: %w", err)
	}
	var log []byte
	var offset int64
	for {
		res, err := r.jobs.ReadJobLogs(wctx, &loopsv1.ReadJobLogsRequest{Id: job.GetId(), Offset: offset, WaitSeconds: 30})
		if err != nil {
			if ctx.Err() != nil {
				_, _ = r.jobs.CancelJob(auth.WithWorkspace(context.WithoutCancel(ctx), ws), &loopsv1.CancelJobRequest{Id: job.GetId()})
			}
			return nil, fmt.Errorf("reading reward job %s: %w", job.GetId(), err)
		}
		if len(log) < maxRewardLog {
			log = append(log, res.GetData()[:min(len(res.GetData()), maxRewardLog-len(log))]...)
		}
		offset = res.GetNextOffset()
		j := res.GetJob()
		if j.GetState() != loopsv1.JobState_JOB_STATE_RUNNING && offset >= j.GetLogBytes() {
			if j.GetState() != loopsv1.JobState_JOB_STATE_SUCCEEDED {
				return nil, fmt.Errorf("reward job %s %s: %s%s", job.GetId(), strings.ToLower(strings.TrimPrefix(j.GetState().String(), "JOB_STATE_")), cmp.Or(j.GetReason(), fmt.Sprintf("exit status %d", j.GetExitCode())), logTail(log))
			}
			break
		}
	}
	for _, line := range strings.Split(string(log), "\n") {
		if rest, ok := strings.CutPrefix(line, marker); ok {
			var out []float64
			if err := json.Unmarshal([]byte(rest), &out); err != nil {
				return nil, fmt.Errorf("reward job %s: its output is not a list of numbers", job.GetId())
			}
			return out, nil
		}
	}
	return nil, errors.New("reward job " + job.GetId() + " printed no rewards" + logTail(log))
}

// logTail is the last lines of a job's log, for an error.
func logTail(log []byte) string {
	s := strings.TrimSpace(string(log))
	if len(s) > 600 {
		s = "…" + s[len(s)-600:]
	}
	if s == "" {
		return ""
	}
	return " (log: " + s + ")"
}

// tarGz packs files into a gzip-compressed tar archive.
func tarGz(files map[string][]byte) ([]byte, error) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, name := range []string{"harness.py", "reward.py", "rows.jsonl"} {
		b := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(b); err != nil {
			return nil, err
		}
	}
	if err := errors.Join(tw.Close(), zw.Close()); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
