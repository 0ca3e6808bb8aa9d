async fn run(pool: sqlx::PgPool) -> Result<(), sqlx::Error> {
    let mut pool = pool;
    inoutbox::sql("SELECT 1").execute(&mut pool).await?;
    Ok(())
}

fn main() {
    let _ = run;
}
