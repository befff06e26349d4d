from diag.cli.main import main

main()
