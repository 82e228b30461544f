package peft

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Bounds of the numbers an adapter_config.json may hold (CheckConfig). A backend applies
// its own, smaller rank limit on top.
const (
	// MaxRank bounds r.
	MaxRank = 1 << 16
	// MaxLoraAlpha bounds lora_alpha. The scale of the update is lora_alpha / r; PEFT's
	// default alpha is 8 and adapters in use stay within a few thousand, while an alpha
	// near the float limits (1e308) overflows every logit it touches.
	MaxLoraAlpha = 1 << 16
	// maxSmallInt bounds the integers of other numeric fields (qalora_group_size).
	maxSmallInt = 1 << 16
)

// fieldCheck checks one field's JSON value (never absent: an absent field has its
// default); it returns what is wrong, or "".
type fieldCheck func(v any) string

// configFields is every adapter_config.json field of a PEFT LoraConfig (peft 0.21) and of
// its PeftConfig base, with the values Loops takes. A field is taken when it is
// metadata or shapes only the adapter's initialization or training (the saved tensors are
// what a backend applies), or when it holds its default; a non-default value that changes
// what the adapter computes is refused with the reason.
var configFields = map[string]fieldCheck{
	// Identity and metadata.
	"peft_type": func(v any) string {
		if v == nil || v == "LORA" {
			return ""
		}
		return fmt.Sprintf("is %s: only LoRA adapters (peft_type LORA) can be imported", show(v))
	},
	"base_model_name_or_path": stringOrNull,
	"revision":                stringOrNull,
	"task_type":               stringOrNull,
	"peft_version":            stringOrNull,
	"auto_mapping":            objectOrNull,
	"inference_mode":          boolean,
	// true: the unembedding LoRA of a tied model adapts the shared embedding matrix (the
	// embedding lookup too, as PEFT ties them); absent or false on a tied model: the head only.
	"ensure_weight_tying": boolean,
	"megatron_core":       stringOrNull, // used only with megatron_config
	"runtime_config":      objectOrNull, // not saved by PEFT; runtime only

	// The numbers.
	"r": func(v any) string {
		return integer(v, 1, MaxRank)
	},
	"lora_alpha": func(v any) string {
		f, ok := number(v)
		if !ok || !(f > 0 && f <= MaxLoraAlpha) {
			return fmt.Sprintf("is %s: give a number above 0 and at most %d (the update is scaled by lora_alpha / r)", show(v), MaxLoraAlpha)
		}
		return ""
	},
	// Dropout applies in training only; PEFT takes a probability below 1.
	"lora_dropout": func(v any) string {
		f, ok := number(v)
		if !ok || !(f >= 0 && f < 1) {
			return fmt.Sprintf("is %s: give a probability from 0 to below 1", show(v))
		}
		return ""
	},
	"qalora_group_size": func(v any) string { return integer(v, 1, maxSmallInt) },

	// Which modules: target_modules names them (each backend checks the names against its
	// model); anything that narrows or widens that set otherwise is refused.
	"target_modules":  func(v any) string { return names(v, "module names", false) },
	"exclude_modules": emptyBecause("Loops adapts exactly the modules target_modules lists and the weights file holds: list only those in target_modules"),
	"layers_to_transform": emptyBecause("Loops applies the adapter to every layer whose tensors adapter_model.safetensors holds, and cannot honour a narrower list: " +
		"remove the field (and the tensors of the other layers, if any)"),
	"layers_pattern":  emptyBecause("it only serves layers_to_transform, which Loops does not support"),
	"rank_pattern":    emptyBecause("every module must have rank r"),
	"alpha_pattern":   emptyBecause("every module must have the scale lora_alpha / r"),
	"modules_to_save": emptyBecause("Loops stores and applies LoRA tensors only, not full copies of modules"),
	// A MoE model's expert parameters (gate_up_proj, down_proj): the backend checks
	// each name against its model's experts, and refuses them on a model without experts.
	"target_parameters": func(v any) string { return names(v, "parameter names", true) },
	"layer_replication": emptyBecause("Loops does not replicate layers of the base model"),
	"trainable_token_indices": emptyBecause(
		"Loops does not apply trainable token embeddings"),
	"alora_invocation_tokens": emptyBecause("Activated LoRA applies the adapter only after its invocation tokens; Loops applies it to every token"),
	"megatron_config":         emptyBecause("Megatron parallel layers are not supported"),
	"loftq_config":            emptyBecause("LoftQ quantizes the base model's weights, so the adapter only fits that quantized model"),
	"velora_config":           emptyBecause("VeLoRA is not supported"),
	"monteclora_config":       emptyBecause("MonteCLoRA samples the adapter's weights; Loops applies fixed weights"),
	"use_bdlora":              emptyBecause("block-diagonal LoRA is not supported"),
	"arrow_config":            emptyBecause("Arrow routing between adapters is not supported"),
	"kasa_config":             emptyBecause("KaSA changes the base model's weights and adds a diagonal between A and B"),

	// Options whose non-default value changes the math.
	"fan_in_fan_out": falseBecause("it says the base layers store weights transposed (GPT-2's Conv1D); the models Loops serves store them as nn.Linear does"),
	"bias": func(v any) string {
		if v == "none" {
			return ""
		}
		return fmt.Sprintf("is %s: Loops adapts no biases, so only \"none\" can be imported (\"all\" and \"lora_only\" train biases the adapter file does not hold)", show(v))
	},
	"use_rslora": falseBecause("rsLoRA scales the update by lora_alpha / sqrt(r); Loops scales it by lora_alpha / r"),
	"use_dora":   falseBecause("DoRA adds a magnitude vector Loops does not apply"),
	"use_qalora": falseBecause("QALoRA pools the inputs of quantized layers"),
	"lora_bias":  falseBecause("Loops applies no bias on lora_B"),

	// Initialization only: the saved tensors are what is applied, unless the method rewrote
	// the base model's weights.
	"init_lora_weights": func(v any) string {
		switch s := v.(type) {
		case bool:
			return ""
		case string:
			switch l := strings.ToLower(s); {
			case l == "gaussian", l == "eva", l == "orthogonal", l == "mica":
				return ""
			case l == "pissa", strings.HasPrefix(l, "pissa_niter_"), l == "olora", l == "corda", l == "loftq", l == "lora_ga":
				return fmt.Sprintf("is %q: that initialization rewrites the base model's weights, so the adapter only fits the rewritten model; "+
					"convert it to a plain LoRA adapter first (PEFT's save_pretrained with path_initial_model_for_weight_conversion)", s)
			}
		}
		return fmt.Sprintf("is %s: not an initialization PEFT knows", show(v))
	},
	"eva_config":     objectOrNull,
	"corda_config":   objectOrNull,
	"lora_ga_config": objectOrNull,
}

// CheckConfig checks the bytes of an adapter_config.json that is to be imported, field by
// field, without a model: a JSON object of at most MaxConfigBytes, each field of a PEFT
// LoraConfig with a value Loops computes exactly as PEFT does (numbers in range: r an
// integer from 1 to MaxRank, lora_alpha above 0 and at most MaxLoraAlpha, lora_dropout from
// 0 to below 1; options that change the adapter's math at their defaults), and any other
// field absent or empty (null, false, 0, "", [] or {}): Loops cannot tell what a field it
// does not know does. lora_alpha must be given (PEFT's default, 8, is not Loops's, 32).
// The error names the first field refused (in name order) and why.
func CheckConfig(b []byte) error {
	if len(b) > MaxConfigBytes {
		return fmt.Errorf("%s is %d bytes, over the %d-byte limit", AdapterConfigFile, len(b), MaxConfigBytes)
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var cfg map[string]any
	if err := d.Decode(&cfg); err != nil || cfg == nil {
		return fmt.Errorf("%s is not a JSON object", AdapterConfigFile)
	}
	if _, err := d.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%s holds more than one JSON value", AdapterConfigFile)
	}
	for _, name := range []string{"r", "lora_alpha", "target_modules"} {
		if _, ok := cfg[name]; !ok {
			return fmt.Errorf("%s has no %s: give it (PEFT writes it; for lora_alpha, PEFT's default is 8)", AdapterConfigFile, name)
		}
	}
	names := make([]string, 0, len(cfg))
	for name := range cfg {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		v := cfg[name]
		check, known := configFields[name]
		var why string
		switch {
		case known:
			why = check(v)
		case !empty(v):
			why = fmt.Sprintf("is %s, and Loops does not know this option, so it cannot tell whether the adapter computes what it did where it was trained: "+
				"remove the field if it is at its default", show(v))
		}
		if why != "" {
			return fmt.Errorf("%s: %q %s", AdapterConfigFile, clip(name), why)
		}
	}
	return nil
}

// names checks a list of module or parameter names (what, for the message); null is an
// empty list where orNull.
func names(v any, what string, orNull bool) string {
	if v == nil && orNull {
		return ""
	}
	list, ok := v.([]any)
	if !ok {
		return fmt.Sprintf("is %s: give a list of %s (a regular expression or \"all-linear\" cannot be checked against the base model)", show(v), what)
	}
	for _, m := range list {
		if _, ok := m.(string); !ok {
			return fmt.Sprintf("holds %s: give a list of %s", show(m), what)
		}
	}
	return ""
}

func stringOrNull(v any) string {
	if _, ok := v.(string); ok || v == nil {
		return ""
	}
	return fmt.Sprintf("is %s: give a string", show(v))
}

func objectOrNull(v any) string {
	if _, ok := v.(map[string]any); ok || v == nil {
		return ""
	}
	return fmt.Sprintf("is %s: give an object", show(v))
}

func boolean(v any) string {
	if _, ok := v.(bool); ok {
		return ""
	}
	return fmt.Sprintf("is %s: give true or false", show(v))
}

// emptyBecause refuses any value but an empty one, saying why.
func emptyBecause(why string) fieldCheck {
	return func(v any) string {
		if empty(v) {
			return ""
		}
		return fmt.Sprintf("is %s: %s", show(v), why)
	}
}

// falseBecause refuses any value but false (or null), saying why.
func falseBecause(why string) fieldCheck {
	return func(v any) string {
		if v == nil || v == false {
			return ""
		}
		return fmt.Sprintf("is %s: %s", show(v), why)
	}
}

// empty reports whether a JSON value is null, false, 0, "", [] or {}.
func empty(v any) bool {
	switch x := v.(type) {
	case nil:
		return true
	case bool:
		return !x
	case json.Number:
		f, err := x.Float64()
		return err == nil && f == 0
	case string:
		return x == ""
	case []any:
		return len(x) == 0
	case map[string]any:
		return len(x) == 0
	}
	return false
}

// number returns a JSON number's value; ok is false for anything else, or a number
// outside float64's range.
func number(v any) (float64, bool) {
	n, ok := v.(json.Number)
	if !ok {
		return 0, false
	}
	f, err := n.Float64()
	return f, err == nil && !math.IsInf(f, 0) && !math.IsNaN(f)
}

// integer checks that v is an integer from lo to hi (written as one: no fraction, no
// exponent).
func integer(v any, lo, hi int64) string {
	n, ok := v.(json.Number)
	if ok {
		if i, err := strconv.ParseInt(string(n), 10, 64); err == nil && i >= lo && i <= hi {
			return ""
		}
	}
	return fmt.Sprintf("is %s: give an integer from %d to %d", show(v), lo, hi)
}

// show writes a JSON value for a message, clipped.
func show(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return "?"
	}
	return clip(string(b))
}

// clip shortens what a message quotes from a file.
func clip(s string) string {
	const n = 80
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
