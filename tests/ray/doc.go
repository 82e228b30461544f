// Package ray is the Ray pool test (make test-ray): a gateway with the torch backend in
// pool mode on a real local Ray cluster (logical GPUs, CPU workers), driven by a tinker
// script (drive.py) while the pool scales 1→3→1, a worker actor is killed and then a whole
// raylet; and a replica of two ranks spanning two raylets, one of them killed while the
// script trains (TestRayShardedReplica). It logs what the script sees and the figures (cold start, failover). Skipped
// unless LOOPS_TEST_RAY=1 (tests/ray/run.sh starts the cluster and sets it).
package ray
