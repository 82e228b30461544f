// Package hfcache finds models in the local Hugging Face hub cache, laid out and located as
// huggingface_hub lays it out and locates it, so that Loops, its Python worker (which asks
// huggingface_hub itself) and a job's transformers agree on which files a model name means.
//
// The hub folder is, as huggingface_hub documents it: $HF_HUB_CACHE (or the older
// $HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
// ~/.cache/huggingface/hub; "~" and $VARIABLES in them are expanded as huggingface_hub
// expands them. A model repository "org/name" is the folder models--org--name of it;
// refs/<revision> names the commit whose files are in snapshots/<commit>.
//
// Model names come from tenants: a repository id or revision that is not one
// huggingface_hub accepts (path separators, "..", other characters) is refused before any
// path is built, and a ref whose content is not a commit id is not followed.
package hfcache
