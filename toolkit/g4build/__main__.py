from g4build.cli import main

main()
