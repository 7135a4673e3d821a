"""The model: tokenizer and sequence classifier from config (pretrained, or from scratch with a learnt
BPE), LoRA adapters, the CPU and first-token fast paths, and a model folder read from a bucket."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "build": ["GENERIC_LABEL", "HEAD", "build_model", "build_tokenizer", "checkpointing", "head_labels", "head_modules",
              "load_export", "load_trained", "save_pretrained", "share_tokenizer", "tokenizer_files",
              "tokenizer_from_files", "train_bpe_tokenizer", "trained_model", "unwrap"],
    "bucket": ["from_bucket", "local_copy"],
    "lora": ["apply"],
}, ["fastpaths", "integrity", "lora"])
