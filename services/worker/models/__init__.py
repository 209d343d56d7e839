"""Model definitions of the Llama family, one file each plus a register."""
