from p2prl.cli.main import main

main()
