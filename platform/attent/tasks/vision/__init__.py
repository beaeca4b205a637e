"""Image classification with a ViT trained from scratch (Fashion-MNIST, digits, image folders)."""
