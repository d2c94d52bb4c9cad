"""What to run: images, prompts and manifests collected into validated requests, and converters from
other formats. May import evaluation (to check scorer names) and the root leaves."""
