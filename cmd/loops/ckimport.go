package main

import (
	"archive/tar"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/loops-dev/loops/backends/peft"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// checkpointsImportCmd is `loops checkpoints import DIR --base-model MODEL [--name NAME]`.
func checkpointsImportCmd(cf *clientFlags) *cobra.Command {
	var baseModel, name string
	cmd := &cobra.Command{
		Use:   "import DIR --base-model MODEL [--name NAME]",
		Short: "Upload a LoRA adapter trained elsewhere (PEFT's or Tinker's layout) as a checkpoint",
		Long: "Upload DIR's adapter_config.json and adapter_model.safetensors (a LoRA adapter in PEFT's\n" +
			"layout, or in Tinker's as `tinker checkpoint download` writes it) as the checkpoint\n" +
			"tinker://<run>/weights/NAME of a new run. The server checks it against the\n" +
			"base model (rank, target modules, every tensor's name and shape) and answers a 400 that\n" +
			"names any mismatch. The checkpoint then samples, deploys and starts training runs\n" +
			"(from_checkpoint) like one saved here.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if baseModel == "" {
				return fmt.Errorf("give the base model the adapter was trained on: --base-model MODEL (loops models lists them)")
			}
			var files []string
			for _, f := range []string{peft.AdapterConfigFile, peft.AdapterWeightsFile} {
				p := filepath.Join(args[0], f)
				if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
					if _, err := os.Stat(filepath.Join(args[0], "config.json")); err == nil {
						return fmt.Errorf("%s is a merged model folder (config.json, no %s): a merged model is not an adapter; import the adapter (loops checkpoints export --format peft, or tinker checkpoint download)", args[0], f)
					}
					return fmt.Errorf("%s holds no %s: give a LoRA adapter folder", args[0], f)
				}
				files = append(files, p)
			}
			pr, pw := io.Pipe()
			go func() { pw.CloseWithError(writeTar(pw, files)) }()
			q := url.Values{"base_model": {baseModel}}
			if name != "" {
				q.Set("name", name)
			}
			req, err := http.NewRequestWithContext(cmd.Context(), http.MethodPost, strings.TrimSuffix(cf.url, "/")+"/v1/checkpoint_imports?"+q.Encode(), pr)
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/x-tar")
			if cf.apiKey != "" {
				req.Header.Set("X-API-Key", cf.apiKey)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			defer res.Body.Close()
			b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
			if err != nil {
				return err
			}
			if res.StatusCode != http.StatusOK {
				return fmt.Errorf("import failed: %s: %s", res.Status, strings.TrimSpace(string(b)))
			}
			var ck loopsv1.Checkpoint
			if err := protojson.Unmarshal(b, &ck); err != nil {
				return fmt.Errorf("import answered %q: %w", b, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %s (base model %s, rank %d, %d bytes)\n", ck.GetTinkerPath(), ck.GetBaseModel(), ck.GetLora().GetRank(), ck.GetSizeBytes())
			return nil
		},
	}
	cmd.Flags().StringVar(&baseModel, "base-model", "", "the served base model the adapter was trained on")
	cmd.Flags().StringVar(&name, "name", "", "checkpoint name (default \"imported\")")
	return cmd
}

// writeTar writes files into a flat tar stream.
func writeTar(w io.Writer, files []string) error {
	tw := tar.NewWriter(w)
	for _, p := range files {
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		st, err := f.Stat()
		if err == nil {
			err = tw.WriteHeader(&tar.Header{Name: filepath.Base(p), Mode: 0o644, Size: st.Size(), ModTime: st.ModTime(), Typeflag: tar.TypeReg})
		}
		if err == nil {
			_, err = io.CopyN(tw, f, st.Size())
		}
		f.Close()
		if err != nil {
			return err
		}
	}
	return tw.Close()
}
