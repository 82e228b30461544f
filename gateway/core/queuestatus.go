package core

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// queueStatus says where a pending operation of workspace ws waits and why, as the
// scheduler sees it now (Tinker's queue_state, and loops.v1's Operation.queue): a training
// operation behind its run's earlier work, waiting for its adapter to be rebuilt or for an
// adapter slot, or for a batch on its base model; a sample waiting for its workspace's
// sampling_concurrency or for a sampler slot. nil when it is not known to wait (it runs,
// or the run left memory).
func (c *Core) queueStatus(ws string, op *loopsv1.Operation) *loopsv1.QueueStatus {
	if op.GetState() == loopsv1.OperationState_OPERATION_STATE_RUNNING {
		return &loopsv1.QueueStatus{State: loopsv1.QueueState_QUEUE_STATE_ACTIVE}
	}
	switch {
	case op.GetTrainingRunId() != "":
		return c.runQueueStatus(op)
	case op.GetSamplerId() != "":
		return c.sampleQueueStatus(ws, op)
	}
	return nil
}

func (c *Core) runQueueStatus(op *loopsv1.Operation) *loopsv1.QueueStatus {
	r := c.runs.peek(op.GetTrainingRunId())
	if r == nil {
		return nil
	}
	capacity := func(reason string) *loopsv1.QueueStatus {
		return &loopsv1.QueueStatus{State: loopsv1.QueueState_QUEUE_STATE_PAUSED_CAPACITY, Reason: reason}
	}
	ahead := r.Ahead(op.GetSeqId())
	l, err := c.laneFor(r.BaseModel())
	if err != nil {
		return nil
	}
	w, batch, inLane := l.Wait(r)
	st := &loopsv1.QueueStatus{State: loopsv1.QueueState_QUEUE_STATE_ACTIVE}
	switch {
	case ahead > 0:
		st.Reason = fmt.Sprintf("after %d earlier operations of training run %s, which run in seq_id order", ahead, r.ID())
	case r.Lost():
		st = capacity(fmt.Sprintf("training run %s's adapter is being rebuilt after its replica was lost; it runs once that is done", r.ID()))
	case inLane:
		if w.Capacity {
			st = capacity(w.Reason)
		} else {
			st.Reason = w.Reason
		}
	default:
		if parked, slots := c.slots.Parked(r); parked {
			st = capacity(fmt.Sprintf("every one of the backend's %d adapter slots is in use by a running task; it runs when one frees", slots))
		}
	}
	st.Position = int32(min(ahead, 1<<30))
	if batch > 0 {
		st.EstimatedWait = durationpb.New(time.Duration(ahead+1) * batch)
	}
	return st
}

func (c *Core) sampleQueueStatus(ws string, op *loopsv1.Operation) *loopsv1.QueueStatus {
	q := c.samplers.queue
	ahead, atLimit, limit, ok := q.position(ws, op.GetId())
	if !ok {
		return nil
	}
	st := &loopsv1.QueueStatus{
		State:    loopsv1.QueueState_QUEUE_STATE_PAUSED_CAPACITY,
		Position: int32(min(ahead, 1<<30)),
		Reason:   fmt.Sprintf("all %d sampler slots are busy; %d of the workspace's samples are before it, and slots are shared fairly between workspaces", q.slots(), ahead),
	}
	if atLimit {
		st.State = loopsv1.QueueState_QUEUE_STATE_PAUSED_RATE_LIMIT
		st.Reason = fmt.Sprintf("the workspace has %d samples running, its sampling_concurrency (workspace policy); %d of its samples are before this one", limit, ahead)
	}
	if d := q.meanService(); d > 0 {
		st.EstimatedWait = durationpb.New(time.Duration(float64(d) * float64(ahead+1) / float64(max(q.slots(), 1))))
	}
	return st
}
