package peft

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestReadConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, AdapterConfigFile), []byte(s), 0o644))
	}
	write(`{"peft_type": "LORA", "r": 8, "base_model_name_or_path": "loops/tiny", "rank_pattern": {"q_proj": 4}}`)
	c, err := ReadConfig(dir)
	require.NoError(t, err)
	require.Equal(t, 8, c.R)
	require.Equal(t, "loops/tiny", c.BaseModel)
	require.Len(t, c.RankPattern, 1)

	write(`{"r": "eight", "base_model_name_or_path": "loops/tiny"}`)
	c, err = ReadConfig(dir)
	require.ErrorContains(t, err, AdapterConfigFile)
	require.Equal(t, "loops/tiny", c.BaseModel, "the fields that decode are returned with the error")

	write(`{"r": 8, "pad": "` + strings.Repeat("x", MaxConfigBytes) + `"}`)
	_, err = ReadConfig(dir)
	require.Error(t, err)
}
