package oracle

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// Decoder turns token ids back into bytes for a byte-level BPE tokenizer.json (the GPT-2 /
// Qwen / Llama 3 scheme, where each byte is written as one printable rune).
type Decoder struct {
	pieces  map[int][]byte
	special map[int]bool
}

// byteRunes is GPT-2's bytes_to_unicode table, inverted: rune → byte.
func byteRunes() map[rune]byte {
	out := map[rune]byte{}
	var bs []int
	for b := '!'; b <= '~'; b++ {
		bs = append(bs, int(b))
	}
	for b := 0xA1; b <= 0xAC; b++ {
		bs = append(bs, b)
	}
	for b := 0xAE; b <= 0xFF; b++ {
		bs = append(bs, b)
	}
	in := map[int]bool{}
	for _, b := range bs {
		in[b] = true
		out[rune(b)] = byte(b)
	}
	n := 0
	for b := 0; b < 256; b++ {
		if !in[b] {
			out[rune(256+n)] = byte(b)
			n++
		}
	}
	return out
}

// LoadDecoder reads dir/tokenizer.json (model.vocab and added_tokens).
func LoadDecoder(dir string) (*Decoder, error) {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	var tj struct {
		Model struct {
			Vocab map[string]int `json:"vocab"`
		} `json:"model"`
		Added []struct {
			ID      int    `json:"id"`
			Content string `json:"content"`
		} `json:"added_tokens"`
	}
	if err := json.Unmarshal(b, &tj); err != nil {
		return nil, fmt.Errorf("tokenizer.json: %w", err)
	}
	inv := byteRunes()
	d := &Decoder{pieces: map[int][]byte{}, special: map[int]bool{}}
	for s, id := range tj.Model.Vocab {
		var bs []byte
		for _, r := range s {
			if c, ok := inv[r]; ok {
				bs = append(bs, c)
			} else {
				bs = append(bs, string(r)...)
			}
		}
		d.pieces[id] = bs
	}
	for _, a := range tj.Added {
		d.pieces[a.ID] = []byte(a.Content)
		d.special[a.ID] = true
	}
	return d, nil
}

// Bytes returns the bytes of the ids, concatenated.
func (d *Decoder) Bytes(ids []int) []byte {
	var out []byte
	for _, id := range ids {
		out = append(out, d.pieces[id]...)
	}
	return out
}

// Decode returns the text of the ids (raw bytes, not repaired).
func (d *Decoder) Decode(ids []int) string { return string(d.Bytes(ids)) }

// IsSpecial reports whether id is an added token of tokenizer.json.
func (d *Decoder) IsSpecial(id int) bool { return d.special[id] }
