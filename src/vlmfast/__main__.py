from vlmfast.cli import main

if __name__ == "__main__":  # vLLM's engine process re-imports the main module (spawn): it must not rerun the CLI
    main()
