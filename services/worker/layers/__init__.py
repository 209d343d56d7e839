"""The layers models are composed of: norms, rotary embedding, attention, MLP, linear kinds (dense,
oneDNN-packed, quantized). They hold no loading code: services/worker/weights/ fills them."""
