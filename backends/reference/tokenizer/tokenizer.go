package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// SplitPattern is the pre-tokenizer regex of the tiny model's tokenizer. It avoids
// look-ahead and uses an explicit whitespace class so Go's RE2 and the Oniguruma engine of
// Hugging Face tokenizers split text identically.
const SplitPattern = ` ?\p{L}+| ?\p{N}+| ?[^\t\n\v\f\r \p{L}\p{N}]+|[\t\n\v\f\r ]+`

var splitRE = regexp.MustCompile(SplitPattern)

var byteToRune [256]rune
var runeToByte = map[rune]byte{}

func init() {
	// GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256+n.
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = byte(b)
	}
}

// ByteLevel maps raw bytes to GPT-2's printable byte-level alphabet.
func ByteLevel(s string) string {
	var sb strings.Builder
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteToRune[s[i]])
	}
	return sb.String()
}

// Special is an added token.
type Special struct {
	ID      int
	Content string
}

// Tokenizer is a byte-level BPE tokenizer.
type Tokenizer struct {
	Vocab     map[string]int
	Merges    [][2]string
	Specials  []Special
	byteLevel bool
	idToStr   []string
	special   map[int]string
	rank      map[[2]string]int
	added     addedMatcher
	// maxTokenBytes is the most bytes of text one token stands for (MaxTokenBytes).
	maxTokenBytes int
}

func (t *Tokenizer) index() {
	n := 0
	for _, id := range t.Vocab {
		n = max(n, id+1)
	}
	for _, s := range t.Specials {
		n = max(n, s.ID+1)
	}
	t.idToStr = make([]string, n)
	for s, id := range t.Vocab {
		t.idToStr[id] = s
	}
	t.special = map[int]string{}
	for _, s := range t.Specials {
		t.special[s.ID] = s.Content
	}
	t.rank = map[[2]string]int{}
	for i, m := range t.Merges {
		if _, ok := t.rank[m]; !ok {
			t.rank[m] = i
		}
	}
	sort.SliceStable(t.Specials, func(i, j int) bool { return len(t.Specials[i].Content) > len(t.Specials[j].Content) })
	t.added = newAddedMatcher(t.Specials)
	t.maxTokenBytes = 1
	for s := range t.Vocab {
		t.maxTokenBytes = max(t.maxTokenBytes, utf8.RuneCountInString(s))
	}
	for _, m := range t.Merges {
		t.maxTokenBytes = max(t.maxTokenBytes, utf8.RuneCountInString(m[0])+utf8.RuneCountInString(m[1]))
	}
	for _, sp := range t.Specials {
		t.maxTokenBytes = max(t.maxTokenBytes, len(sp.Content))
	}
}

// MaxTokenBytes is the most bytes of text that one token Encode returns stands for: the
// longest vocabulary entry or merge (a byte-level symbol is one byte of text) or added
// token. So a text of more than n × MaxTokenBytes bytes encodes to more than n tokens, which
// a caller can refuse without encoding it.
func (t *Tokenizer) MaxTokenBytes() int { return t.maxTokenBytes }

// Size is the number of token ids (vocabulary plus added tokens).
func (t *Tokenizer) Size() int { return len(t.idToStr) }

// TokenID returns the id of a token string (added tokens included).
func (t *Tokenizer) TokenID(s string) (int, bool) {
	for _, sp := range t.Specials {
		if sp.Content == s {
			return sp.ID, true
		}
	}
	id, ok := t.Vocab[s]
	return id, ok
}

// Train learns a byte-level BPE with vocabSize ids in total (256 bytes, merges, then the
// special tokens) from text, deterministically: each step merges the most frequent pair,
// ties broken by the smaller pair in byte order.
func Train(text string, vocabSize int, specials []string) *Tokenizer {
	t := &Tokenizer{Vocab: map[string]int{}, byteLevel: true}
	for b := 0; b < 256; b++ {
		t.Vocab[string(byteToRune[b])] = b
	}
	counts := map[string]int{}
	for _, w := range splitRE.FindAllString(text, -1) {
		counts[ByteLevel(w)]++
	}
	keys := make([]string, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	words := make([][]string, len(keys))
	freq := make([]int, len(keys))
	for i, k := range keys {
		for _, r := range k {
			words[i] = append(words[i], string(r))
		}
		freq[i] = counts[k]
	}
	target := vocabSize - len(specials)
	for len(t.Vocab) < target {
		pairs := map[[2]string]int{}
		for i, w := range words {
			for j := 0; j+1 < len(w); j++ {
				pairs[[2]string{w[j], w[j+1]}] += freq[i]
			}
		}
		var best [2]string
		bc := 0
		for p, c := range pairs {
			if c > bc || (c == bc && (p[0]+"\x00"+p[1]) < (best[0]+"\x00"+best[1])) {
				best, bc = p, c
			}
		}
		if bc < 1 {
			break
		}
		merged := best[0] + best[1]
		t.Merges = append(t.Merges, best)
		if _, ok := t.Vocab[merged]; !ok {
			t.Vocab[merged] = len(t.Vocab)
		}
		for i, w := range words {
			words[i] = applyMerge(w, best, merged)
		}
	}
	next := len(t.Vocab)
	for _, s := range specials {
		t.Specials = append(t.Specials, Special{ID: next, Content: s})
		next++
	}
	t.index()
	return t
}

func applyMerge(w []string, p [2]string, merged string) []string {
	out := w[:0:0]
	for j := 0; j < len(w); j++ {
		if j+1 < len(w) && w[j] == p[0] && w[j+1] == p[1] {
			out = append(out, merged)
			j++
		} else {
			out = append(out, w[j])
		}
	}
	return out
}

// Encode tokenizes text: added tokens are matched first (the leftmost, and of those that
// start there the longest, as Hugging Face tokenizers match them), the rest is split with
// SplitPattern, mapped to byte-level characters, and merged by rank. Its time is linear in
// the text's length (times the length of the longest added token) and, within one word,
// O(n log n) in the word's length.
func (t *Tokenizer) Encode(text string) []int {
	ids, _ := t.EncodeLimit(text, -1)
	return ids
}

// splitBatch is how many pre-tokenizer matches EncodeLimit asks the regexp for at a time.
const splitBatch = 1024

// EncodeLimit is Encode that stops as soon as it knows that text encodes to more than limit
// tokens (limit < 0: no limit). It returns the tokens and true when text was encoded whole,
// and false once it is over limit, with the tokens encoded by then (a word's tokens come
// together, so possibly more than limit; or fewer, when the next word alone is longer than
// MaxTokenBytes × the tokens left). So refusing a text costs about the encoding of its first
// limit tokens, never of all of it.
func (t *Tokenizer) EncodeLimit(text string, limit int) (ids []int, complete bool) {
	return t.encode(text, limit, nil)
}

// encode is EncodeLimit, counting its steps in n when n is not nil (tests).
func (t *Tokenizer) encode(text string, limit int, n *steps) (ids []int, complete bool) {
	over := func() bool { return limit >= 0 && len(ids) > limit }
	sc := bpeScratch{steps: n}
	for pos := 0; ; {
		start, end, sp := t.added.find(text, pos, n)
		chunk := text[pos:]
		if start >= 0 {
			chunk = text[pos:start]
		}
		for len(chunk) > 0 {
			locs := splitRE.FindAllStringIndex(chunk, splitBatch)
			if len(locs) == 0 {
				break
			}
			for _, loc := range locs {
				w := chunk[loc[0]:loc[1]]
				if limit >= 0 && len(ids)+(len(w)+t.maxTokenBytes-1)/t.maxTokenBytes > limit {
					// The word alone is more bytes than the tokens left can hold.
					return ids, false
				}
				ids = sc.word(t, ids, w)
				if over() {
					return ids, false
				}
			}
			chunk = chunk[locs[len(locs)-1][1]:]
		}
		if start < 0 {
			return ids, true
		}
		ids = append(ids, t.Specials[sp].ID)
		if over() {
			return ids, false
		}
		pos = end
	}
}

// Decode turns ids into text. Added tokens decode to their content; unknown ids are
// skipped. Invalid UTF-8 is kept as raw bytes.
func (t *Tokenizer) Decode(ids []int) string {
	var b bytes.Buffer
	for _, id := range ids {
		if s, ok := t.special[id]; ok {
			b.WriteString(s)
			continue
		}
		if id < 0 || id >= len(t.idToStr) {
			continue
		}
		s := t.idToStr[id]
		if !t.byteLevel {
			b.WriteString(decodeSentencePiece(s))
			continue
		}
		for _, r := range s {
			if c, ok := runeToByte[r]; ok {
				b.WriteByte(c)
			} else {
				b.WriteRune(r)
			}
		}
	}
	return b.String()
}

// TokenBytes is the text one token stands for, as bytes: nil for an added (special)
// token or an id outside the vocabulary.
func (t *Tokenizer) TokenBytes(id int) []byte {
	if _, ok := t.special[id]; ok || id < 0 || id >= len(t.idToStr) || t.idToStr[id] == "" {
		return nil
	}
	return []byte(t.Decode([]int{id}))
}

func decodeSentencePiece(s string) string {
	if len(s) == 6 && strings.HasPrefix(s, "<0x") && strings.HasSuffix(s, ">") {
		if v, err := strconv.ParseUint(s[3:5], 16, 8); err == nil {
			return string([]byte{byte(v)})
		}
	}
	return strings.ReplaceAll(s, "\u2581", " ")
}

type hfAdded struct {
	ID         int    `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// WriteHF writes dir/tokenizer.json and dir/tokenizer_config.json. eos names the end of
// sequence token (an added token); chatTemplate may be empty.
func (t *Tokenizer) WriteHF(dir, eos string, maxLen int, chatTemplate string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	added := make([]hfAdded, 0, len(t.Specials))
	sp := append([]Special(nil), t.Specials...)
	sort.Slice(sp, func(i, j int) bool { return sp[i].ID < sp[j].ID })
	for _, s := range sp {
		added = append(added, hfAdded{ID: s.ID, Content: s.Content, Special: true})
	}
	merges := make([]string, len(t.Merges))
	for i, m := range t.Merges {
		merges[i] = m[0] + " " + m[1]
	}
	byteLevel := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}
	doc := map[string]any{
		"version":      "1.0",
		"truncation":   nil,
		"padding":      nil,
		"added_tokens": added,
		"normalizer":   nil,
		"pre_tokenizer": map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": SplitPattern}, "behavior": "Isolated", "invert": false},
			byteLevel,
		}},
		"post_processor": nil,
		"decoder":        byteLevel,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": t.Vocab, "merges": merges,
		},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		return err
	}
	decl := map[string]any{}
	for _, s := range sp {
		decl[strconv.Itoa(s.ID)] = hfAdded{ID: s.ID, Content: s.Content, Special: true}
	}
	cfg := map[string]any{
		"tokenizer_class":              "PreTrainedTokenizerFast",
		"added_tokens_decoder":         stripIDs(decl),
		"eos_token":                    eos,
		"pad_token":                    eos,
		"bos_token":                    nil,
		"unk_token":                    nil,
		"model_max_length":             maxLen,
		"clean_up_tokenization_spaces": false,
		"add_prefix_space":             false,
		"errors":                       "replace",
	}
	if chatTemplate != "" {
		cfg["chat_template"] = chatTemplate
	}
	b, err = json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), b, 0o644)
}

func stripIDs(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		a := v.(hfAdded)
		out[k] = map[string]any{"content": a.Content, "lstrip": false, "normalized": false, "rstrip": false, "single_word": false, "special": true}
	}
	return out
}

// LoadHF reads a Hugging Face tokenizer.json (BPE model). Decoding works for byte-level and
// SentencePiece-style vocabularies; Encode is only exact for tokenizers written by WriteHF.
func LoadHF(path string) (*Tokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var doc struct {
		Added        []hfAdded       `json:"added_tokens"`
		PreTokenizer json.RawMessage `json:"pre_tokenizer"`
		Decoder      json.RawMessage `json:"decoder"`
		Model        struct {
			Type   string            `json:"type"`
			Vocab  map[string]int    `json:"vocab"`
			Merges []json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if doc.Model.Vocab == nil {
		return nil, fmt.Errorf("%s: no model.vocab (only BPE tokenizers are supported)", path)
	}
	t := &Tokenizer{Vocab: doc.Model.Vocab}
	t.byteLevel = bytes.Contains(doc.Decoder, []byte(`"ByteLevel"`)) || bytes.Contains(doc.PreTokenizer, []byte(`"ByteLevel"`))
	for _, m := range doc.Model.Merges {
		var s string
		var pair []string
		if json.Unmarshal(m, &s) == nil {
			if a, b, ok := strings.Cut(s, " "); ok {
				t.Merges = append(t.Merges, [2]string{a, b})
			}
		} else if json.Unmarshal(m, &pair) == nil && len(pair) == 2 {
			t.Merges = append(t.Merges, [2]string{pair[0], pair[1]})
		}
	}
	for _, a := range doc.Added {
		t.Specials = append(t.Specials, Special{ID: a.ID, Content: a.Content})
	}
	t.index()
	return t, nil
}
