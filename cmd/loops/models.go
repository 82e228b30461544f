package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

func modelsCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "models",
		Short: "List the base models a server can train and sample, and the tinker-cookbook renderer each takes",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cl := loopsv1connect.NewModelServiceClient(http.DefaultClient, cf.url, cf.options()...)
			resp, err := cl.ListModels(cmd.Context(), &loopsv1.ListModelsRequest{})
			if err != nil {
				return err
			}
			return printModels(os.Stdout, resp.GetModels())
		},
	}
	cf.register(cmd)
	return cmd
}

// cookbookOrgs are the model-name prefixes tinker-cookbook's model table
// (tinker_cookbook/model_info.py, get_model_attributes) knows: a served model named by its
// Hugging Face id under one of them gets its renderer looked up by name.
var cookbookOrgs = []string{"meta-llama/", "Qwen/", "deepseek-ai/", "openai/", "moonshotai/", "zai-org/", "nvidia/", "thinkingmachines/Inkling"}

// cookbookRenderer says which tinker-cookbook renderer a served model takes: the renderer
// name to pass as renderer_name=..., or "" when the cookbook looks the model up by name
// itself (auto is then true). For a model the cookbook does not know and that is not
// loops/tiny, both are empty: the renderer follows the model's chat template.
func cookbookRenderer(name string) (renderer string, auto bool) {
	if name == tiny.Name {
		return tiny.Renderer, false
	}
	for _, org := range cookbookOrgs {
		if strings.HasPrefix(name, org) {
			return "", true
		}
	}
	return "", false
}

// printModels writes the model table of `loops models` and how to pass each model's
// renderer to tinker-cookbook. A model the cookbook does not know by name takes its
// family's renderer (ModelInfo.renderer) when the backend names one.
func printModels(w io.Writer, models []*loopsv1.ModelInfo) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MODEL\tFAMILY\tPUBLISHER\tARCH\tMODALITIES\tMAX SEQ LEN\tVOCAB\tMAX LORA RANK\tUSE\tAVAILABILITY\tPARAMS\tDTYPE\tDEVICES/REPLICA\tBACKEND\tCOOKBOOK RENDERER")
	planned := false
	var hint *loopsv1.ModelInfo
	hintRenderer := ""
	for _, m := range models {
		renderer, auto := cookbookRenderer(m.GetName())
		if renderer == "" && !auto {
			renderer = m.GetRenderer()
		}
		col := renderer
		switch {
		case auto:
			col = "(by model name)"
		case renderer == "":
			col = "(its chat template's)"
		case hint == nil:
			hint, hintRenderer = m, renderer
		}
		planned = planned || m.GetDeviceMemoryBytes() > 0
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.GetName(), dash(m.GetFamily()), dash(m.GetPublisher()),
			m.GetArchitecture(), dash(strings.Join(m.GetModalities(), ",")), m.GetMaxSequenceLength(), m.GetVocabSize(), m.GetMaxLoraRank(),
			uses(m), dash(strings.Join(m.GetAvailability(), ",")), params(m.GetParameterCount()), dash(m.GetWeightDtype()), devices(m), m.GetBackend(), col)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if planned {
		fmt.Fprint(w, "\nDEVICES/REPLICA: devices of that memory one replica needs for the model's full context, one adapter of MAX LORA RANK; "+
			"MAX SEQ LEN: the longest sequence a replica of the configured size holds (docs/scale-out.md).\n")
	}
	if hint != nil {
		fmt.Fprintf(w, "\ntinker-cookbook looks a renderer up by model name and does not know these models "+
			"(\"Unknown model\"): pass it,\n  e.g. python -m tinker_cookbook.recipes.chat_sl.train model_name=%s renderer_name=%s ...\n"+
			"Recipes without a renderer_name option (recipes/sl_loop.py, rl_loop.py) need renderer_name set in their code.\n",
			hint.GetName(), hintRenderer)
	}
	return nil
}

// params writes a parameter count in billions or millions ("8.19B", "0.6M"); "-" for 0.
func params(n int64) string {
	switch {
	case n <= 0:
		return "-"
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	default:
		return fmt.Sprintf("%.2fM", float64(n)/1e6)
	}
}

// devices writes a planned model's devices per replica and their memory ("2 × 80 GiB");
// "none" when no number of devices holds its full context (a sequence is not split), "-"
// when the model was not planned.
func devices(m *loopsv1.ModelInfo) string {
	mem := m.GetDeviceMemoryBytes()
	switch {
	case mem <= 0:
		return "-"
	case m.GetDevicesPerReplica() <= 0:
		return fmt.Sprintf("none of %.4g GiB", float64(mem)/(1<<30))
	default:
		return fmt.Sprintf("%d × %.4g GiB", m.GetDevicesPerReplica(), float64(mem)/(1<<30))
	}
}

// uses says what a model may be used for: "train,sample", "train", "sample" or "-".
func uses(m *loopsv1.ModelInfo) string {
	var out []string
	if m.GetTrainable() {
		out = append(out, "train")
	}
	if m.GetSampleable() {
		out = append(out, "sample")
	}
	return dash(strings.Join(out, ","))
}
