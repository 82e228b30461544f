package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/spf13/cobra"
)

// maxExtractFiles caps the files an export may hold (a model folder holds a dozen).
const maxExtractFiles = 256

// checkpointsExportCmd is `loops checkpoints export PATH --format peft|merged -o DIR`.
func checkpointsExportCmd(cf *clientFlags) *cobra.Command {
	var format, out string
	cmd := &cobra.Command{
		Use:   "export PATH --format peft|merged -o DIR",
		Short: "Download a checkpoint as a PEFT adapter folder or as a merged Hugging Face model",
		Long: "Download a checkpoint (tinker://…) into DIR: --format peft writes its adapter folder\n" +
			"(adapter_config.json, adapter_model.safetensors); --format merged writes a complete\n" +
			"Hugging Face model folder (config.json, model.safetensors in float32, the tokenizer files)\n" +
			"with the adapter folded into the base model's weights, which transformers loads as is.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			f, ok := map[string]loopsv1.ExportFormat{
				"peft": loopsv1.ExportFormat_EXPORT_FORMAT_PEFT, "merged": loopsv1.ExportFormat_EXPORT_FORMAT_MERGED,
			}[format]
			if !ok {
				return fmt.Errorf("--format %q: want peft or merged", format)
			}
			if out == "" {
				return errors.New("give the folder to write with -o DIR")
			}
			cl := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, cf.url, cf.options()...)
			resp, err := cl.GetCheckpointExportURL(cmd.Context(), &loopsv1.GetCheckpointExportURLRequest{Path: args[0], Format: f})
			if err != nil {
				return err
			}
			req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, strings.TrimSuffix(cf.url, "/")+resp.GetUrl(), nil)
			if err != nil {
				return err
			}
			if cf.apiKey != "" {
				req.Header.Set("X-API-Key", cf.apiKey)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			defer res.Body.Close()
			if res.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(io.LimitReader(res.Body, 4096))
				return fmt.Errorf("export failed: %s: %s", res.Status, strings.TrimSpace(string(b)))
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return err
			}
			files, bytes, err := extractTar(res.Body, out)
			if err != nil {
				return fmt.Errorf("export of %s into %s: %w", args[0], out, err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %d files (%d bytes) to %s\n", files, bytes, out)
			return nil
		},
	}
	cmd.Flags().StringVar(&format, "format", "peft", "peft (the adapter folder) or merged (a Hugging Face model with the adapter folded in)")
	cmd.Flags().StringVarP(&out, "output", "o", "", "folder to write the files into (created if missing)")
	return cmd
}

// extractTar writes the regular files of a flat tar stream into dir. Names with a folder
// part are refused: exports are flat folders.
func extractTar(r io.Reader, dir string) (files int, bytes int64, err error) {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return files, bytes, nil
		}
		if err != nil {
			return files, bytes, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if h.Name != filepath.Base(h.Name) || h.Name == "." || h.Name == ".." || strings.ContainsAny(h.Name, `/\`) {
			return files, bytes, fmt.Errorf("unexpected file name %q in the export", h.Name)
		}
		if files++; files > maxExtractFiles {
			return files, bytes, fmt.Errorf("the export holds more than %d files", maxExtractFiles)
		}
		f, err := os.Create(filepath.Join(dir, h.Name))
		if err != nil {
			return files, bytes, err
		}
		n, err := io.Copy(f, tr)
		bytes += n
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return files, bytes, err
		}
	}
}
