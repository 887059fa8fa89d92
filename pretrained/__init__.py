"""
Pretrained checkpoints and their tokenizers, read from local files (nothing downloads):

- load_llama.py: Meta's and Hugging Face's Llama 3 layouts (safetensors read and written here).
- load_gguf.py: llama.cpp's GGUF files (pip install gguf), SmolLM2 among them.
- tokenizer.py: Llama 3's tiktoken BPE, a GGUF file's BPE, and the demo's characters.
- hf_tokenizer.py: a Hugging Face tokenizer.json (byte-level BPE: Qwen-3, SmolLM2) for tiktoken.
- loading.py: one entry for train.py, sample.py and evaluate.py: a run's checkpoints, or a
  pretrained model by path or name.
"""
