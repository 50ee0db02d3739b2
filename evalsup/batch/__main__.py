from evalsup.batch.driver import main

main()
