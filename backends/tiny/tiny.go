package tiny

import (
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/loops-dev/loops/backends/reference/tokenizer"
	"github.com/loops-dev/loops/internal/hfcache"
)

// Name is the built-in model's name.
const Name = "loops/tiny"

// Renderer is the tinker-cookbook renderer of loops/tiny: its tokenizer has ChatML
// <|im_start|>/<|im_end|> as single tokens and no <think>, which is the cookbook's
// qwen3_instruct (ChatML without thinking).
const Renderer = "qwen3_instruct"

// Version changes whenever the generated folder would change; Write rewrites folders with
// another version.
const Version = "3"

// Seed is the fixed seed of the random weights.
const Seed = 20240917

// Special tokens: EOS is <|endoftext|>; the chat markers follow Qwen's ChatML.
const (
	EOS      = "<|endoftext|>"
	IMStart  = "<|im_start|>"
	IMEnd    = "<|im_end|>"
	VocabLen = 512
)

// Config is the model's shape: vocab 512, hidden 256, 4 layers, 4 query heads and 2
// key/value heads of width 64, SwiGLU width 768, q/k RMSNorm, RoPE θ=1e6, tied embeddings,
// 2048 positions.
func Config() nn.Config {
	return nn.Config{
		Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3",
		Vocab: VocabLen, Hidden: 256, Layers: 4, Heads: 4, KVHeads: 2, HeadDim: 64, Inter: 768,
		MaxPos: 2048, RopeTheta: 1e6, Eps: 1e-6, Tied: true, HiddenAct: "silu",
		TorchDType: "float32",
	}
}

// Tokenizer trains the tiny model's tokenizer (deterministic).
func Tokenizer() *tokenizer.Tokenizer {
	return tokenizer.Train(corpus, VocabLen, []string{EOS, IMStart, IMEnd})
}

// chatTemplate is ChatML, with Qwen2.5's tool calling (its instructions shortened) when
// tools are given: the tools in the system turn, each call <tool_call>\n{"name": …, "arguments": …}\n</tool_call>, tool
// results in a user turn as <tool_response> blocks. Without tools it renders what it always
// did.
const chatTemplate = "{% if tools %}{{ '<|im_start|>system\\n' }}{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}" +
	"{{ '# Tools\\n<tools>' }}" +
	"{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}" +
	"{{ '\\n</tools>\\nCall a tool with <tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}{% endif %}" +
	"{% for message in messages %}" +
	"{% if tools and loop.first and message['role'] == 'system' %}" +
	"{% elif message['role'] == 'assistant' and message['tool_calls'] %}{{ '<|im_start|>assistant' }}{% if message['content'] %}{{ '\\n' + message['content'] }}{% endif %}" +
	"{% for tool_call in message['tool_calls'] %}{% set call = tool_call['function'] %}{{ '\\n<tool_call>\\n{\"name\": \"' + call['name'] + '\", \"arguments\": ' }}{{ call['arguments'] | tojson }}{{ '}\\n</tool_call>' }}{% endfor %}{{ '<|im_end|>\\n' }}" +
	"{% elif message['role'] == 'tool' %}{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{% endif %}" +
	"{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}" +
	"{% else %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endif %}{% endfor %}" +
	"{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// Write builds the folder in dir unless it already holds this version.
func Write(dir string) error {
	if b, err := os.ReadFile(filepath.Join(dir, "loops-tiny-version")); err == nil && strings.TrimSpace(string(b)) == Version {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tok := Tokenizer()
	if tok.Size() != VocabLen {
		return fmt.Errorf("tiny tokenizer has %d ids, want %d", tok.Size(), VocabLen)
	}
	eos, _ := tok.TokenID(EOS)
	imEnd, _ := tok.TokenID(IMEnd)
	cfg := Config()
	cfg.EOS = eos
	m, err := nn.NewRandom[float32](cfg, nn.RandomOptions{QKNorm: true, Std: 0.02, Seed: Seed})
	if err != nil {
		return err
	}
	if err := nn.WriteConfig(dir, m.Cfg, map[string]any{
		"eos_token_id": eos, "bos_token_id": eos, "attention_bias": false, "use_cache": true,
		"transformers_version": "4.51.0",
	}); err != nil {
		return err
	}
	if _, err := safetensors.Write(filepath.Join(dir, "model.safetensors"), m.Tensors(), map[string]string{"format": "pt"}); err != nil {
		return err
	}
	if err := tok.WriteHF(dir, EOS, cfg.MaxPos, chatTemplate); err != nil {
		return err
	}
	gc, _ := json.MarshalIndent(map[string]any{"eos_token_id": []int{eos, imEnd}, "bos_token_id": eos}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), gc, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "loops-tiny-version"), []byte(Version+"\n"), 0o644)
}

// corpus is the tokenizer's training text.
const corpus = `Hello world! Hello, world. The quick brown fox jumps over the lazy dog.
Loops is a self-hosted service for fine-tuning language models with LoRA adapters. You write
the training loop in Python; the server runs the trainer and the sampler. A training run
starts from a base model, adds a low-rank adapter, and takes optimizer steps on batches of
examples. Each example is a sequence of tokens with a weight for every position, and the
loss is the sum of the weighted negative log-probabilities of the target tokens.
The sampler generates text from the model: it reads a prompt, computes the probability of
every token in the vocabulary, and draws the next token. The temperature sharpens or
flattens the distribution; top-k keeps the k most likely tokens and top-p keeps the
smallest set whose probability reaches p. When the text contains a stop string, the
sampler stops and returns the tokens it has produced, with the log-probability of each.
Reinforcement learning uses rewards instead of labels. The policy samples several answers
to each question, a grader scores them, and the advantages tell the trainer which answers
to make more likely. Importance sampling corrects for the difference between the policy
that sampled the data and the policy that is being trained. PPO clips the ratio so that a
single step cannot move the policy too far, and CISPO clips the weight but keeps the
gradient of every token.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 3.14159 2.71828 1e-6 0.001.
Code: def main(): print("hello") ; for i in range(10): x = x + i ; return {"key": [1, 2, 3]}
func main() { fmt.Println("hello, world") } // a comment in Go; if err != nil { return err }
The user asked a question and the assistant answered it. What is the capital of France?
The capital of France is Paris. What is two plus two? Two plus two is four. Thank you!
Once upon a time there was a little model that wanted to learn. It read the same story
again and again, and every time it read the story it made fewer mistakes. In the end it
could tell the story by itself, word for word, from the first line to the last.
The weather today is sunny with a light breeze; tomorrow there will be rain in the morning
and clouds in the afternoon. Remember to water the plants, feed the cat, and call home.
`

// RegisterInHubCache copies the model folder dir (tokenizer, config, weights) into the local
// Hugging Face hub cache as the repository "loops/tiny", so that
// AutoTokenizer.from_pretrained("loops/tiny") works offline on this machine (the tinker
// SDK's SamplingClient.get_tokenizer loads the tokenizer by the base model's name), and so
// do AutoModelForCausalLM.from_pretrained and tinker-cookbook's build_hf_model and
// build_lora_adapter with base_model="loops/tiny". The weights (13 MB) are copied only when
// the snapshot does not hold them yet. It returns the snapshot folder.
func RegisterInHubCache(dir string) (string, error) {
	hub, err := hfcache.HubDir()
	if err != nil {
		return "", err
	}
	sum := sha1.Sum([]byte("loops/tiny@" + Version))
	files := map[string][]byte{}
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			return "", err
		}
		files[f] = b
	}
	commit := hex.EncodeToString(sum[:])
	snap, err := hfcache.Add(hub, Name, commit, files)
	if err != nil {
		return "", err
	}
	const weights = "model.safetensors"
	src, err := os.Stat(filepath.Join(dir, weights))
	if err != nil {
		return "", err
	}
	if dst, err := os.Stat(filepath.Join(snap, weights)); err == nil && dst.Size() == src.Size() {
		return snap, nil
	}
	b, err := os.ReadFile(filepath.Join(dir, weights))
	if err != nil {
		return "", err
	}
	return hfcache.Add(hub, Name, commit, map[string][]byte{weights: b})
}
