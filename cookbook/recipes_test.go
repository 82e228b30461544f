package cookbook

import (
	"io/fs"
	"sort"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"
)

// The embedded list is registry.py's, and every name has its module (and every module a name).
func TestRecipesMatchTheRecipeModules(t *testing.T) {
	names, err := Recipes(Files)
	require.NoError(t, err)
	require.Contains(t, names, "sft_chat")
	require.Equal(t, "sft_chat", names[0])
	mods, err := fs.Glob(Files, "loops_cookbook/recipes/*.py")
	require.NoError(t, err)
	var modNames []string
	for _, m := range mods {
		if n := strings.TrimSuffix(m[len("loops_cookbook/recipes/"):], ".py"); n != "__init__" {
			modNames = append(modNames, n)
		}
	}
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	sort.Strings(modNames)
	require.Equal(t, modNames, sorted)
}

func TestRecipesRefusesAListItCannotRead(t *testing.T) {
	for name, body := range map[string]string{
		"no block":   "X = 1\n",
		"odd entry":  "\nRECIPES: dict[str, str] = {\n    \"ok\": \"a\",\n    \"Bad-Name\": \"b\",\n}\n",
		"empty list": "\nRECIPES: dict[str, str] = {\n\n}\n",
	} {
		_, err := Recipes(fstest.MapFS{registryPath: {Data: []byte(body)}})
		require.Error(t, err, name)
	}
	_, err := Recipes(fstest.MapFS{})
	require.Error(t, err)
}
