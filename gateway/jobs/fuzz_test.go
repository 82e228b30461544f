package jobs

import (
	"archive/tar"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// FuzzSubmit feeds SubmitJob's input surface (the request message as sent, its fields'
// checks and the archive's unpacking) arbitrary bytes: never a panic, every refusal a
// client error with a message that shows no folder of the gateway's, and whatever is
// unpacked stays inside the job's folder, within the caps, as regular files (0644 or 0755)
// and folders (0755) only: no set-uid bit, no link, nothing a job could turn on the
// gateway.
func FuzzSubmit(f *testing.F) {
	seed := func(m *loopsv1.SubmitJobRequest) {
		b, err := proto.Marshal(m)
		require.NoError(f, err)
		f.Add(b)
	}
	seed(&loopsv1.SubmitJobRequest{Entrypoint: "train.py", Archive: tarball(f, false, map[string]string{"train.py": "print(1)", "d/x": "y"})})
	seed(&loopsv1.SubmitJobRequest{Entrypoint: "train.py", Archive: tarball(f, true, map[string]string{"train.py": "print(1)"}), Args: []string{"--a", "b"}})
	seed(&loopsv1.SubmitJobRequest{Entrypoint: "a.py", Archive: tarball(f, false, map[string]string{"../a.py": "x", "/etc/passwd": "x"})})
	seed(&loopsv1.SubmitJobRequest{Recipe: "sft_chat", Args: []string{"steps=2"}})
	seed(&loopsv1.SubmitJobRequest{Recipe: "sft_chat", Archive: tarball(f, true, map[string]string{"data/train.jsonl": "{}\n"})})
	// A path as a file and a folder, in both orders and below; a set-uid file.
	seed(&loopsv1.SubmitJobRequest{Entrypoint: "a", Archive: rawTar(f, []tarEntry{{"a", tar.TypeReg, "x"}, {"a/", tar.TypeDir, ""}})})
	seed(&loopsv1.SubmitJobRequest{Entrypoint: "a", Archive: rawTar(f, []tarEntry{{"a", tar.TypeReg, "x"}, {"a/b/c", tar.TypeReg, "y"}})})
	seed(&loopsv1.SubmitJobRequest{Entrypoint: "b/c", Archive: rawTar(f, []tarEntry{{"b/c", tar.TypeReg, "x"}, {"b", tar.TypeReg, "y"}})})
	seed(&loopsv1.SubmitJobRequest{Entrypoint: "s", Archive: rawTar(f, []tarEntry{{"d/", tar.TypeDir, ""}, {"d/", tar.TypeDir, ""}, {"s", tar.TypeReg, "x"}})})
	var setuid bytes.Buffer
	tw := tar.NewWriter(&setuid)
	require.NoError(f, tw.WriteHeader(&tar.Header{Name: "s", Typeflag: tar.TypeReg, Mode: 0o6777, Size: 1}))
	_, _ = tw.Write([]byte("x"))
	require.NoError(f, tw.Close())
	seed(&loopsv1.SubmitJobRequest{Entrypoint: "s", Archive: setuid.Bytes()})
	s := &Service{o: Options{MaxArchiveBytes: 1 << 20}}
	f.Fuzz(func(t *testing.T, b []byte) {
		var m loopsv1.SubmitJobRequest
		if proto.Unmarshal(b, &m) != nil {
			return
		}
		if err := s.validate(&m); err != nil {
			require.NotEmpty(t, err.Error())
			return
		}
		if len(m.GetArchive()) == 0 {
			return
		}
		root := t.TempDir()
		dir := filepath.Join(root, "files")
		require.NoError(t, os.Mkdir(dir, 0o755))
		const maxFiles, maxBytes = 20, 1 << 16
		err := Unpack(m.GetArchive(), dir, maxFiles, maxBytes)
		var ea *errArchive
		if err != nil {
			require.True(t, errors.As(err, &ea), "an upload's fault is a client error: %v", err)
			require.NotContains(t, err.Error(), root, "a refusal shows no folder of the gateway's")
		}
		var files int
		var total int64
		require.NoError(t, filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			require.NoError(t, err)
			if p == root {
				return nil
			}
			require.True(t, p == dir || strings.HasPrefix(p, dir+string(filepath.Separator)), "%s is outside the job's folder", p)
			info, err := d.Info()
			require.NoError(t, err)
			require.True(t, info.IsDir() || info.Mode().IsRegular(), "%s is neither a file nor a folder", p)
			if p != dir {
				perm := info.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
				if info.IsDir() {
					require.Equal(t, fs.FileMode(0o755), perm, "%s", p)
				} else {
					require.Contains(t, []fs.FileMode{0o644, 0o755}, perm, "%s", p)
				}
			}
			if info.Mode().IsRegular() {
				files++
				total += info.Size()
			}
			return nil
		}))
		require.LessOrEqual(t, files, maxFiles)
		require.LessOrEqual(t, total, int64(maxBytes))
	})
}
