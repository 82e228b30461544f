package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// operatorFlags are the flags of the operator's commands (loops pools, loops allocations):
// the client flags and the operator key, sent instead of --api-key when set.
type operatorFlags struct {
	clientFlags
	operatorKey string
	json        bool
}

func (o *operatorFlags) register(cmd *cobra.Command) {
	o.clientFlags.register(cmd)
	cmd.PersistentFlags().StringVar(&o.operatorKey, "operator-key", env("LOOPS_OPERATOR_KEY", ""),
		"operator key, one of loops serve's --operator-key values (LOOPS_OPERATOR_KEY); with no keys configured on the server, any tml-… key from loopback")
	cmd.PersistentFlags().BoolVar(&o.json, "json", false, "print the answer as JSON (loops.v1 field names)")
}

func (o *operatorFlags) client() loopsv1connect.PoolServiceClient {
	cf := o.clientFlags
	if o.operatorKey != "" {
		cf.apiKey = o.operatorKey
	}
	return loopsv1connect.NewPoolServiceClient(http.DefaultClient, cf.url, cf.options()...)
}

// printJSON writes m as indented JSON with the proto field names, zero values included.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true, EmitUnpopulated: true}.Marshal(m)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

// poolsCmd is `loops pools`: the gateway's worker pools (loops.v1 PoolService).
func poolsCmd() *cobra.Command {
	var of operatorFlags
	cmd := &cobra.Command{
		Use:   "pools",
		Short: "List, show, scale and delete the server's worker pools (operator)",
		Long: "Worker pools are the replicas of the torch backend in pool mode (loops serve --backend torch\n" +
			"--backend-opt provider=local|static|ray). These commands need an operator key: one of loops\n" +
			"serve's --operator-key values (--operator-key or LOOPS_OPERATOR_KEY here); a server with no\n" +
			"keys configured at all takes any tml-… key from loopback. See docs/pools.md.",
	}
	of.register(cmd)

	list := &cobra.Command{
		Use:   "list",
		Short: "List the pools",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := of.client().ListPools(cmd.Context(), &loopsv1.ListPoolsRequest{})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			return printPools(cmd.OutOrStdout(), resp.GetPools())
		},
	}

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show a pool and its replicas",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl := of.client()
			p, err := cl.GetPool(cmd.Context(), &loopsv1.GetPoolRequest{Id: args[0]})
			if err != nil {
				return err
			}
			as, err := cl.ListAllocations(cmd.Context(), &loopsv1.ListAllocationsRequest{PoolId: args[0]})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), &loopsv1.ListAllocationsResponse{Allocations: as.GetAllocations()})
			}
			if err := printPool(cmd.OutOrStdout(), p); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout())
			return printAllocations(cmd.OutOrStdout(), as.GetAllocations())
		},
	}

	var replicas int
	scale := &cobra.Command{
		Use:   "scale ID --replicas N",
		Short: "Set a pool's replicas (the adapters of replicas that stop are lost: their runs reload their last checkpoint)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if replicas < 0 || replicas > 1<<20 {
				return fmt.Errorf("--replicas %d: want 0 or more", replicas)
			}
			n := int32(replicas)
			p, err := of.client().ScalePool(cmd.Context(), &loopsv1.ScalePoolRequest{Id: args[0], Replicas: &n})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), p)
			}
			return printPool(cmd.OutOrStdout(), p)
		},
	}
	scale.Flags().IntVar(&replicas, "replicas", -1, "the replicas to run (0 stops every one)")
	_ = scale.MarkFlagRequired("replicas")

	del := &cobra.Command{
		Use:   "delete ID",
		Short: "Stop every replica of a pool and forget it until the server restarts (their adapters are lost)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := of.client().DeletePool(cmd.Context(), &loopsv1.DeletePoolRequest{Id: args[0]}); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "deleted pool %s\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(list, show, scale, del, poolCredentialsCmd())
	return cmd
}

// allocationsCmd is `loops allocations`: every replica of the pools and what it holds.
func allocationsCmd() *cobra.Command {
	var of operatorFlags
	var pool string
	cmd := &cobra.Command{
		Use:   "allocations",
		Short: "Show every replica of the worker pools: state, GPUs, address, the runs whose adapters it holds, GPU-seconds (operator)",
		Long: "One line per replica slot of the server's worker pools. Needs an operator key, as loops pools\n" +
			"does. See docs/pools.md.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			resp, err := of.client().ListAllocations(cmd.Context(), &loopsv1.ListAllocationsRequest{PoolId: pool})
			if err != nil {
				return err
			}
			if of.json {
				return printJSON(cmd.OutOrStdout(), resp)
			}
			return printAllocations(cmd.OutOrStdout(), resp.GetAllocations())
		},
	}
	of.register(cmd)
	cmd.Flags().StringVar(&pool, "pool", "", "only this pool's replicas")
	return cmd
}

// poolRoleName is a role as the tables show it.
func poolRoleName(r loopsv1.PoolRole) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "POOL_ROLE_"))
}

// allocationStateName is a state as the tables show it.
func allocationStateName(s loopsv1.AllocationState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "ALLOCATION_STATE_"))
}

// seconds formats a count of seconds, whole.
func seconds(s float64) string { return strconv.FormatFloat(s, 'f', 0, 64) }

// printPools writes one line per pool.
func printPools(w io.Writer, ps []*loopsv1.Pool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tROLE\tBASE MODEL\tPROVIDER\tDESIRED\tREGISTERED\tGPUS/REPLICA\tPREEMPTIBLE\tGPU-SECONDS\tREPLICA-SECONDS")
	for _, p := range ps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\t%v\t%s\t%s\n", p.GetId(), poolRoleName(p.GetRole()), p.GetBaseModel(), p.GetProvider(),
			p.GetDesiredReplicas(), p.GetRegisteredReplicas(), gpusOf(p), p.GetPreemptible(), seconds(p.GetGpuSeconds()), seconds(p.GetReplicaSeconds()))
	}
	if len(ps) == 0 {
		fmt.Fprintln(tw, "(no pools)")
	}
	return tw.Flush()
}

// gpusOf is a pool's GPUs per replica and their kind: "2 H100", "2", "0".
func gpusOf(p *loopsv1.Pool) string {
	s := strconv.Itoa(int(p.GetGpusPerReplica()))
	if k := p.GetGpuKind(); k != "" && p.GetGpusPerReplica() > 0 {
		s += " " + k
	}
	return s
}

// printPool writes one pool in detail.
func printPool(w io.Writer, p *loopsv1.Pool) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "pool\t%s\n", p.GetId())
	fmt.Fprintf(tw, "role\t%s\n", poolRoleName(p.GetRole()))
	fmt.Fprintf(tw, "base model\t%s\n", p.GetBaseModel())
	fmt.Fprintf(tw, "provider\t%s\n", p.GetProvider())
	fmt.Fprintf(tw, "replicas\t%d desired, %d registered\n", p.GetDesiredReplicas(), p.GetRegisteredReplicas())
	fmt.Fprintf(tw, "gpus per replica\t%s\n", gpusOf(p))
	fmt.Fprintf(tw, "preemptible\t%v\n", p.GetPreemptible())
	fmt.Fprintf(tw, "gpu-seconds\t%s\n", seconds(p.GetGpuSeconds()))
	fmt.Fprintf(tw, "replica-seconds\t%s\n", seconds(p.GetReplicaSeconds()))
	switch {
	case p.GetTrainingRunId() != "":
		idle := ""
		if p.GetIdle() {
			idle = " (scaled to zero while idle)"
		}
		if r := p.GetZeroReason(); r != "" {
			idle = " (at zero: " + r + ")"
		}
		fmt.Fprintf(tw, "dedicated to\t%s, workspace %s%s\n", p.GetTrainingRunId(), p.GetWorkspace(), idle)
	case p.GetWarm():
		fmt.Fprintf(tw, "dedicated to\tnone: kept warm for the next dedicated run of its shape\n")
	}
	return tw.Flush()
}

// maxRunsShown is how many run ids a line of the allocations table names.
const maxRunsShown = 3

// printAllocations writes one line per replica slot.
func printAllocations(w io.Writer, as []*loopsv1.Allocation) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POOL\tREPLICA\tSTATE\tSINCE\tGPUS\tADDRESS\tADAPTERS\tRUNS\tGPU-SECONDS\tREPLICA-SECONDS")
	for _, a := range as {
		gpus := strconv.Itoa(int(a.GetGpus()))
		if len(a.GetGpuIds()) > 0 {
			gpus = strings.Join(a.GetGpuIds(), ",")
		}
		state := allocationStateName(a.GetState())
		if r := a.GetStateReason(); r != "" && len(r) <= 60 {
			state += " (" + r + ")"
		}
		since := "-"
		if a.GetSince() != nil {
			since = a.GetSince().AsTime().Local().Format(time.DateTime)
		}
		runs := a.GetTrainingRunIds()
		shown := strings.Join(runs[:min(len(runs), maxRunsShown)], ",")
		if len(runs) > maxRunsShown {
			shown += fmt.Sprintf(",…+%d", len(runs)-maxRunsShown)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", a.GetPoolId(), a.GetReplica(), state, since, gpus,
			dash(a.GetAddress()), a.GetAdapterCount(), dash(shown), seconds(a.GetGpuSeconds()), seconds(a.GetReplicaSeconds()))
	}
	if len(as) == 0 {
		fmt.Fprintln(tw, "(no replicas)")
	}
	return tw.Flush()
}
